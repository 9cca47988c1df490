"""The YSB query as DataFrame steps: generate -> deserialize -> filter -> project -> join -> enrich
-> window -> sink, the window Spark's stateful operator or the sink's own. Each step takes and returns
a DataFrame; only this module and app.py import pyspark.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import DataStreamWriter, StreamingQuery
from pyspark.sql.types import LongType, StringType, StructField, StructType

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


# What the Python UDF (pyudfs.view_of) returns per view event: the projection's columns.
VIEW_SCHEMA = StructType([StructField("ad_id", StringType()), StructField("event_time", LongType())])

WINDOW_MS = 10_000
CAMPAIGN_JOIN_CLASS = "ysb.RedisSink$CampaignJoin"


@dataclass(frozen=True)
class SinkSpec:
    kind: str  # "redis" or "file"
    redis_port: int = 0
    path: str = ""
    sink_jar_class: str = "ysb.RedisSink"


def _sql_string(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _pick(values: Sequence[str], index: Column) -> Column:
    """``values[index]`` for an index column in 0..len-1, for the few short value lists of YSB (the
    array is one literal folded into a constant; keep it small, it travels in every batch's plan)."""
    array = F.expr("array(" + ", ".join(_sql_string(v) for v in values) + ")")
    return F.element_at(array, index + F.lit(1))


def _hex(number: Column, width: int) -> Column:
    return F.lpad(F.lower(F.hex(number)), width, "0")


def ad_id_column(ad_index: Column, ads_per_campaign: int) -> Column:
    """campaigns.ad_id of ad number ``ad_index`` (over all campaigns), as a column expression."""
    campaign = F.floor(ad_index / F.lit(ads_per_campaign))
    ad = F.pmod(ad_index, F.lit(ads_per_campaign))
    return F.concat(_hex(campaign, 8), F.lit("-"), _hex(ad, 4), F.lit("-4000-8000-"), _hex(ad_index, 12))


def campaign_id_column(ad_index: Column, ads_per_campaign: int) -> Column:
    """campaigns.campaign_id of the campaign ad number ``ad_index`` belongs to."""
    return F.concat(_hex(F.floor(ad_index / F.lit(ads_per_campaign)), 8), F.lit("-0000-4000-a000-000000000000"))


def random_uuid() -> Column:
    """A random UUID string per row, made as YSB's generator makes it (java.util.UUID.randomUUID).

    Not uuid(): Spark gives each uuid() a fresh random seed whenever a plan is analysed, i.e. in every
    micro-batch, and the generated code inlines the seed (``new RandomUUIDGenerator(<seed>L + ...)``),
    so each batch's fused stage was new Java source: Janino compiled it and the JIT compiled it again
    on every executor, for the whole life of the query (half the executors' CPU). reflect() has no
    seed: the same plan and code every batch. Being nondeterministic, it also keeps the optimizer
    from pushing the filter on the parsed JSON below the generator, which would make every event's
    JSON twice (once for the filter, once for the projection).
    """
    return F.expr("reflect('java.util.UUID', 'randomUUID')")


def wall_clock_ms() -> Column:
    """The wall clock in epoch ms, read per row when the row is evaluated.

    Not current_timestamp(): in a streaming query Spark replaces it by the batch's start time as a
    *literal* (CurrentBatchTimestamp), and generated Java code inlines literals, so every micro-batch
    would compile new classes (see random_uuid). reflect() is nondeterministic, never folded, and
    gives the same plan in every batch.
    """
    return F.expr("reflect('java.lang.System', 'currentTimeMillis')").cast("long")


def generate_events_continuous(
    spark: SparkSession, rate: int, ads: int, ads_per_campaign: int, partitions: int
) -> DataFrame:
    """The same events for Continuous Processing, which reads only the ``rate`` source (``rate`` rows per
    second in wall-clock time, spread over ``partitions`` long-running reader tasks)."""
    rows = spark.readStream.format("rate").option("rowsPerSecond", rate).option("numPartitions", partitions).load()
    return rows.select(event_json(ads, ads_per_campaign).alias("value"))


def generate_events(
    spark: SparkSession, rate: int, ads: int, ads_per_campaign: int, partitions: int, batch_seconds: float = 1.0
) -> DataFrame:
    """Ad events as JSON strings, made inside the executors (YSB's Kafka input carries the same JSON):
    one column ``value``. Spark's rate-micro-batch source gives each micro-batch ``rate * batch_seconds``
    rows whose event times advance by ``batch_seconds`` per batch from the start time: a fixed offered
    load that never builds a backlog, so a slow machine shows up as slower batches, not a growing queue.
    ``ads`` ads (numbered over all campaigns) are picked uniformly."""
    import time

    rows = (
        spark.readStream.format("rate-micro-batch")
        .option("rowsPerBatch", max(1, int(rate * batch_seconds)))
        .option("numPartitions", partitions)
        .option("startTimestamp", int(time.time() * 1000))
        .option("advanceMillisPerBatch", max(1, int(batch_seconds * 1000)))
        .load()
    )
    return rows.select(event_json(ads, ads_per_campaign).alias("value"))


def event_json(ads: int, ads_per_campaign: int) -> Column:
    """One YSB ad event as JSON from the rate source's ``value`` and ``timestamp`` columns."""
    event = F.struct(
        random_uuid().alias("user_id"),
        random_uuid().alias("page_id"),
        ad_id_column(F.pmod(F.hash("value", F.lit(11)), F.lit(ads)), ads_per_campaign).alias("ad_id"),
        _pick(AD_TYPES, F.pmod(F.hash("value", F.lit(13)), F.lit(len(AD_TYPES)))).alias("ad_type"),
        _pick(EVENT_TYPES, F.pmod(F.hash("value", F.lit(17)), F.lit(len(EVENT_TYPES)))).alias("event_type"),
        F.unix_millis("timestamp").cast("string").alias("event_time"),
        F.concat_ws(
            ".", *[F.pmod(F.hash("value", F.lit(seed)), F.lit(256)).cast("string") for seed in (19, 23, 29, 31)]
        ).alias("ip_address"),
    )
    return F.to_json(event)


def read_kafka(spark: SparkSession, bootstrap: str, topic: str) -> DataFrame:
    """The ad events as YSB reads them: JSON records of a Kafka topic (Spark's Kafka reader, micro-batch
    or continuous as the query's trigger says, from the latest offsets on), one column ``value``. The
    cast of the record's bytes to a string is part of the read; from_json (deserialize) stays a step of
    its own, as in the paper."""
    rows = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "latest")
        .option("failOnDataLoss", "false")  # the demo's broker drops old segments of a long run
        .load()
    )
    return rows.select(F.col("value").cast("string").alias("value"))


def deserialize(raw: DataFrame) -> DataFrame:
    """JSON text -> typed columns (from_json)."""
    return raw.select(F.from_json("value", EVENT_SCHEMA).alias("event")).select("event.*")


def filter_views(events: DataFrame) -> DataFrame:
    return events.where(F.col("event_type") == F.lit("view"))


def project(events: DataFrame) -> DataFrame:
    return events.select("ad_id", F.col("event_time").cast("long").alias("event_time"))


def python_views(raw: DataFrame) -> DataFrame:
    """Deserialize, filter and projection as one Python UDF (pyudfs.view_of, run by PySpark's Python
    workers: each row pickled to the worker and its answer back), the rows it returns None for dropped.

    Nondeterministic, as random_uuid: a deterministic UDF lets the optimizer push the null filter below
    the projection, and each row then ran through the UDF twice (once for the filter, once for the columns).
    """
    from coordinator.workloads.ysb.pyudfs import view_of

    view = F.udf(view_of, VIEW_SCHEMA).asNondeterministic()
    return raw.select(view("value").alias("view")).where(F.col("view").isNotNull()).select("view.*")


def views_of(raw: DataFrame, udf: str) -> DataFrame:
    """The view events' ad_id and event_time: SQL expressions (from_json, where, select) or ``udf``
    "python" (python_views)."""
    if udf == "python":
        return python_views(raw)
    return project(filter_views(deserialize(raw)))


def campaigns_frame(spark: SparkSession, campaigns: int, ads_per_campaign: int) -> DataFrame:
    """The static ad -> campaign table (the paper's static cache), the rows of campaigns.ad_campaign_mapping.

    Made in the JVM from a range, not with createDataFrame from a Python list: a micro-batch query
    re-reads its static side every batch, and a Python list would cost a Python worker task per batch.
    """
    ad_index = F.col("id")
    return spark.range(campaigns * ads_per_campaign).select(
        ad_id_column(ad_index, ads_per_campaign).alias("ad_id"),
        campaign_id_column(ad_index, ads_per_campaign).alias("campaign_id"),
    )


def join_campaigns(events: DataFrame, campaigns: DataFrame) -> DataFrame:
    return events.join(F.broadcast(campaigns), on="ad_id", how="inner")


def join_campaigns_continuous(spark: SparkSession, events: DataFrame) -> DataFrame:
    """The join for Continuous Processing, which supports no joins: a lookup of each ad in the static
    table (a Java UDF from the sink jar that loads the table from Redis once per executor)."""
    spark.udf.registerJavaFunction("ysb_campaign_of", CAMPAIGN_JOIN_CLASS, StringType())
    return events.withColumn("campaign_id", F.call_function("ysb_campaign_of", F.col("ad_id"))).where(
        F.col("campaign_id").isNotNull()
    )


def enrich(events: DataFrame) -> DataFrame:
    """Event-time column and the pre-window latency (now - event time, ms) of the extended YSB."""
    return events.withColumn("event_ts", F.timestamp_millis("event_time")).withColumn(
        "pre_window_latency_ms", wall_clock_ms() - F.col("event_time")
    )


def window_counts(events: DataFrame, watermark: str = WINDOW) -> DataFrame:
    """10 s event-time tumbling windows per campaign: count, latest event, worst pre-window latency.

    The watermark is on the event's window start (event time truncated to 10 s), not on the event time:
    the same windows, closed at the same point (a window [t, t+10 s) closes once an event of t+20 s or
    later arrived, either way), but Spark compiles the watermark into the state store's eviction and
    late-data predicates as a literal, so a watermark that moved every micro-batch made every batch
    compile two new classes on each executor; now it moves once per window.
    """
    window_start_ms = F.col("event_time") - F.pmod(F.col("event_time"), F.lit(WINDOW_MS))
    return (
        events.withColumn("event_window_ts", F.timestamp_millis(window_start_ms))
        .withWatermark("event_window_ts", watermark)
        .groupBy(F.window("event_window_ts", WINDOW), "campaign_id")
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
        wall_clock_ms().alias("written_at_ms"),
    )


def _window_sink(writer: DataStreamWriter, sink: SinkSpec) -> DataStreamWriter:
    """The Redis sink's window mode: the sink keeps the 10 s window counts (a cache per task and epoch
    or micro-batch, added to the window's hash in Redis when the task commits)."""
    if sink.kind != "redis":
        raise ValueError("the window in the sink needs the Redis sink (it keeps the window state)")
    return (
        writer.format(sink.sink_jar_class).outputMode("append")
        .option("host", "127.0.0.1").option("port", str(sink.redis_port)).option("prefix", "ysb:")
        .option("windowMillis", str(WINDOW_MS))
    )


def start_continuous_query(
    rows: DataFrame, sink: SinkSpec, checkpoint: str, epoch_seconds: float
) -> StreamingQuery:
    """Continuous trigger into the Redis sink's window mode (Continuous Processing has no stateful
    operators, so the window is always the sink's)."""
    writer = rows.writeStream.option("checkpointLocation", checkpoint).queryName("ysb")
    return _window_sink(writer.trigger(continuous=f"{epoch_seconds} seconds"), sink).start()


# Real-time Mode (Spark 4.1+, trigger(realTime=...)) runs each batch as long-running tasks that process
# records as they arrive; it accepts only the operators and sinks of its allowlist
# (RealTimeModeAllowlist: project, filter, broadcast hash join, ...; no aggregation, so no stateful
# window; sinks Kafka, foreach, console, memory) and only the update output mode. The YSB window stays
# in a ForeachWriter over the Redis sink's WindowCache (RedisSink.windowForeachWriter), as on CP.


def realtime_trigger(batch_seconds: float) -> str:
    """The realTime trigger's batch duration: whole seconds or milliseconds, as Spark parses them."""
    millis = round(batch_seconds * 1000)
    return f"{millis // 1000} seconds" if millis % 1000 == 0 else f"{millis} milliseconds"


def start_realtime_query(
    spark: SparkSession, rows: DataFrame, sink: SinkSpec, checkpoint: str, batch_seconds: float
) -> StreamingQuery:
    """Real-time Mode into the window sink's ForeachWriter (a JVM object made through py4j: a Python
    foreach writer would run every row through a Python worker), update mode."""
    if sink.kind != "redis":
        raise ValueError("Real-time Mode keeps the window in the Redis sink")
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    jwriter = getattr(jvm, sink.sink_jar_class).windowForeachWriter("127.0.0.1", sink.redis_port, "ysb:", WINDOW_MS)
    writer = rows.writeStream.option("checkpointLocation", checkpoint).queryName("ysb").outputMode("update")
    writer = writer.trigger(realTime=realtime_trigger(batch_seconds))  # type: ignore[call-overload]  # pyspark 4.2 stubs lack it
    writer._jwrite = writer._jwrite.foreach(jwriter)
    return writer.start()


def start_query(
    rows: DataFrame, sink: SinkSpec, checkpoint: str, trigger_seconds: float, window: str = "state"
) -> StreamingQuery:
    """Redis: every executor task writes its rows itself (update mode: the changed windows of Spark's
    stateful window), or with ``window`` "sink" the rows of build_ysb's sink window into the sink's
    window mode; file: CSV files (append mode)."""
    writer = rows.writeStream.option("checkpointLocation", checkpoint).queryName("ysb")
    if trigger_seconds > 0:
        writer = writer.trigger(processingTime=f"{trigger_seconds} seconds")
    if window == "sink":
        return _window_sink(writer, sink).start()
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


def sink_window_rows(events: DataFrame) -> DataFrame:
    """The rows the Redis sink's window mode counts (RedisSink.WindowCacheWriter): campaign_id,
    event_time, pre_window_latency_ms per view event."""
    return enrich(events).select("campaign_id", "event_time", "pre_window_latency_ms")


def build_ysb(
    spark: SparkSession, rate: int, campaigns: int, ads_per_campaign: int, partitions: int, batch_seconds: float = 1.0,
    kafka: tuple[str, str] | None = None, window: str = "state", udf: str = "sql",
) -> DataFrame:
    """The whole YSB transformation from the source to the sink rows: the generator, or with ``kafka``
    (bootstrap servers, topic) the records of a Kafka topic. ``window`` "state": Spark's stateful
    window (window_counts) makes the sink rows; "sink": no stateful operator, the sink keeps the
    window (sink_window_rows), as YSB's own Spark code keeps it in Redis. ``udf`` "python": deserialize,
    filter and projection in a Python UDF (views_of)."""
    if kafka is not None:
        raw = read_kafka(spark, *kafka)
    else:
        raw = generate_events(spark, rate, campaigns * ads_per_campaign, ads_per_campaign, partitions, batch_seconds)
    views = views_of(raw, udf)
    joined = join_campaigns(views, campaigns_frame(spark, campaigns, ads_per_campaign))
    if window == "sink":
        return sink_window_rows(joined)
    return sink_rows(window_counts(enrich(joined)))


def build_ysb_continuous(
    spark: SparkSession, rate: int, campaigns: int, ads_per_campaign: int, partitions: int,
    kafka: tuple[str, str] | None = None,
) -> DataFrame:
    """YSB for Continuous Processing up to the sink, which computes the window (sink_window_rows). The
    source: the rate generator, or with ``kafka`` (bootstrap servers, topic) Spark's continuous Kafka
    reader."""
    if kafka is not None:
        raw = read_kafka(spark, *kafka)
    else:
        raw = generate_events_continuous(spark, rate, campaigns * ads_per_campaign, ads_per_campaign, partitions)
    return sink_window_rows(join_campaigns_continuous(spark, project(filter_views(deserialize(raw)))))
