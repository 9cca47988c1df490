package ysb;

import java.util.HashMap;
import java.util.Map;

import org.apache.flink.api.common.eventtime.WatermarkStrategy;
import org.apache.flink.api.common.serialization.SimpleStringSchema;
import org.apache.flink.connector.kafka.source.KafkaSource;
import org.apache.flink.connector.kafka.source.enumerator.initializer.OffsetsInitializer;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;

/**
 * YsbFlink's pipeline reading YSB's JSON ad events from a Kafka topic with flink-connector-kafka's
 * KafkaSource (its split readers fetch in their own threads and hand records to the task), from the
 * topic's latest offsets on, the record's value decoded as UTF-8 text; DeserializeBolt stays the JSON step.
 *
 * usage: YsbFlinkKafka --kafka-bootstrap HOST:PORT --kafka-topic T --ads FILE --redis-port P [--parallelism 2]
 */
public final class YsbFlinkKafka {
    private YsbFlinkKafka() {
    }

    public static void main(String[] argv) throws Exception {
        Map<String, String> args = YsbFlink.arguments(argv);
        HashMap<String, String> adToCampaign = YsbFlink.adCampaigns(args.get("ads"));
        KafkaSource<String> source = KafkaSource.<String>builder()
            .setBootstrapServers(args.get("kafka-bootstrap"))
            .setTopics(args.getOrDefault("kafka-topic", "ysb"))
            .setGroupId("ysb-flink")
            .setStartingOffsets(OffsetsInitializer.latest())
            .setValueOnlyDeserializer(new SimpleStringSchema())
            .build();
        StreamExecutionEnvironment env = YsbFlink.environment(args);
        YsbFlink.run(env, env.fromSource(source, WatermarkStrategy.noWatermarks(), "YSB Kafka"), adToCampaign, args);
    }
}
