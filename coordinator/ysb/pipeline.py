"""The YSB query as DataFrame steps: generate -> deserialize -> filter -> project -> join -> enrich
-> window -> sink. Each step takes and returns a DataFrame; only this module and app.py import pyspark.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.types import StringType, StructField, StructType

from coordinator.ysb.campaigns import AdCampaign

AD_TYPES = ("banner", "modal", "sponsored-search", "mail", "mobile")
EVENT_TYPES = ("view", "click", "purchase")
WINDOW = "10 seconds"

EVENT_SCHEMA = StructType(
    [
        StructField("user_id", StringType()),
        StructField("page_id", StringType()),
        StructField("ad_id", StringType()),
        StructField("ad_type", StringType()),
        StructField("event_type", StringType()),
        StructField("event_time", StringType()),  # epoch milliseconds as text, as YSB's generator writes it
        StructField("ip_address", StringType()),
    ]
)


@dataclass(frozen=True)
class SinkSpec:
    kind: str  # "redis" or "file"
    redis_port: int = 0
    path: str = ""
    sink_jar_class: str = "ysb.RedisSink"


def _sql_string(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _pick(values: Sequence[str], index: Column) -> Column:
    """``values[index]`` for an index column in 0..len-1. The array is one SQL literal expression (one
    driver round trip instead of one per element; Spark folds it into a constant)."""
    array = F.expr("array(" + ", ".join(_sql_string(v) for v in values) + ")")
    return F.element_at(array, index + F.lit(1))


def generate_events(
    spark: SparkSession, rate: int, ad_ids: Sequence[str], partitions: int, batch_seconds: float = 1.0
) -> DataFrame:
    """Ad events as JSON strings, made inside the executors (YSB's Kafka input carries the same JSON):
    one column ``value``. Spark's rate-micro-batch source gives each micro-batch ``rate * batch_seconds``
    rows whose event times advance by ``batch_seconds`` per batch from the start time: a fixed offered
    load that never builds a backlog, so a slow machine shows up as slower batches, not a growing queue."""
    import time  # noqa: PLC0415 - only the start timestamp

    rows = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", max(1, int(rate * batch_seconds)))
        .option("numPartitions", partitions)
        .option("startTimestamp", int(time.time() * 1000))
        .option("advanceMillisPerBatch", max(1, int(batch_seconds * 1000)))
        .load()
    )
    event = F.struct(
        F.expr("uuid()").alias("user_id"),
        F.expr("uuid()").alias("page_id"),
        _pick(ad_ids, F.pmod(F.hash("value", F.lit(11)), F.lit(len(ad_ids)))).alias("ad_id"),
        _pick(AD_TYPES, F.pmod(F.hash("value", F.lit(13)), F.lit(len(AD_TYPES)))).alias("ad_type"),
        _pick(EVENT_TYPES, F.pmod(F.hash("value", F.lit(17)), F.lit(len(EVENT_TYPES)))).alias("event_type"),
        F.unix_millis("timestamp").cast("string").alias("event_time"),
        F.concat_ws(
            ".", *[F.pmod(F.hash("value", F.lit(seed)), F.lit(256)).cast("string") for seed in (19, 23, 29, 31)]
        ).alias("ip_address"),
    )
    return rows.select(F.to_json(event).alias("value"))


def deserialize(raw: DataFrame) -> DataFrame:
    """JSON text -> typed columns (from_json)."""
    return raw.select(F.from_json("value", EVENT_SCHEMA).alias("event")).select("event.*")


def filter_views(events: DataFrame) -> DataFrame:
    return events.where(F.col("event_type") == F.lit("view"))


def project(events: DataFrame) -> DataFrame:
    return events.select("ad_id", F.col("event_time").cast("long").alias("event_time"))


def campaigns_frame(spark: SparkSession, mapping: Sequence[AdCampaign]) -> DataFrame:
    """The static ad -> campaign table (the paper's static cache), built once at start-up."""
    return spark.createDataFrame([(m.ad_id, m.campaign_id) for m in mapping], "ad_id string, campaign_id string")


def join_campaigns(events: DataFrame, campaigns: DataFrame) -> DataFrame:
    return events.join(F.broadcast(campaigns), on="ad_id", how="inner")


def enrich(events: DataFrame) -> DataFrame:
    """Event-time column and the pre-window latency (now - event time, ms) of the extended YSB."""
    return events.withColumn("event_ts", F.timestamp_millis("event_time")).withColumn(
        "pre_window_latency_ms", F.unix_millis(F.current_timestamp()) - F.col("event_time")
    )


def window_counts(events: DataFrame, watermark: str = WINDOW) -> DataFrame:
    """10 s event-time tumbling windows per campaign: count, latest event, worst pre-window latency."""
    return (
        events.withWatermark("event_ts", watermark)
        .groupBy(F.window("event_ts", WINDOW), "campaign_id")
        .agg(
            F.count(F.lit(1)).alias("events"),
            F.max("event_time").alias("last_event_time"),
            F.max("pre_window_latency_ms").alias("max_pre_window_latency_ms"),
        )
    )


def sink_rows(windows: DataFrame) -> DataFrame:
    """Flat rows for the sink; the first column is the Redis key suffix ``campaign:window_start_ms``."""
    start_ms = F.unix_millis(F.col("window.start"))
    return windows.select(
        F.concat_ws(":", F.col("campaign_id"), start_ms.cast("string")).alias("key"),
        F.col("campaign_id"),
        start_ms.alias("window_start_ms"),
        F.col("events"),
        F.col("last_event_time"),
        F.col("max_pre_window_latency_ms"),
        F.unix_millis(F.current_timestamp()).alias("written_at_ms"),
    )


def start_query(rows: DataFrame, sink: SinkSpec, checkpoint: str, trigger_seconds: float) -> StreamingQuery:
    """Redis: every executor task writes its rows itself (update mode); file: CSV files (append mode)."""
    writer = rows.writeStream.option("checkpointLocation", checkpoint).queryName("ysb")
    if trigger_seconds > 0:
        writer = writer.trigger(processingTime=f"{trigger_seconds} seconds")
    if sink.kind == "redis":
        writer = (
            writer.format(sink.sink_jar_class)
            .outputMode("update")
            .option("host", "127.0.0.1")
            .option("port", str(sink.redis_port))
            .option("prefix", "ysb:")
        )
    else:
        # CSV rather than JSON: a JSON writer's frames look like the generator's (JacksonGenerator).
        writer = writer.format("csv").outputMode("append").option("path", sink.path).option("header", "true")
    return writer.start()


def build_ysb(
    spark: SparkSession, rate: int, mapping: Sequence[AdCampaign], partitions: int, batch_seconds: float = 1.0
) -> DataFrame:
    """The whole YSB transformation from the generator to the sink rows."""
    raw = generate_events(spark, rate, sorted({m.ad_id for m in mapping}), partitions, batch_seconds)
    joined = join_campaigns(project(filter_views(deserialize(raw))), campaigns_frame(spark, mapping))
    return sink_rows(window_counts(enrich(joined)))
