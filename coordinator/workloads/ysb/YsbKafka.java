package ysb;

import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.atomic.AtomicLong;
import java.util.stream.Collectors;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.ListOffsetsResult;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * The demo's Kafka side outside the engines' processes: topic admin and YSB's ad event producer.
 *
 * <pre>
 *   create-topic BOOTSTRAP TOPIC PARTITIONS
 *   end-offsets  BOOTSTRAP TOPIC                 prints "END_OFFSETS total" (sum over partitions)
 *   produce      BOOTSTRAP TOPIC RATE CAMPAIGNS ADS_PER_CAMPAIGN
 * </pre>
 *
 * produce writes RATE JSON events per second (YSB's fields; ad ids as campaigns.py makes them) until
 * SIGTERM, and prints "PRODUCED acknowledged epoch_ms" once a second and once more after its last
 * flush: acknowledged counts only records the broker confirmed.
 */
public final class YsbKafka {
    private static final String[] AD_TYPES = {"banner", "modal", "sponsored-search", "mail", "mobile"};
    private static final String[] EVENT_TYPES = {"view", "click", "purchase"};

    private static volatile boolean stopping;

    private YsbKafka() {}

    public static void main(String[] args) throws Exception {
        if (args.length < 2) {
            throw new IllegalArgumentException("usage: create-topic|end-offsets|produce BOOTSTRAP ...");
        }
        switch (args[0]) {
            case "create-topic" -> createTopic(args[1], args[2], Integer.parseInt(args[3]));
            case "end-offsets" -> System.out.println("END_OFFSETS " + endOffsets(args[1], args[2]));
            case "produce" -> produce(args[1], args[2], Integer.parseInt(args[3]), Integer.parseInt(args[4]),
                    Integer.parseInt(args[5]));
            default -> throw new IllegalArgumentException(args[0] + ": unknown command");
        }
    }

    private static Admin admin(String bootstrap) {
        Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        return Admin.create(props);
    }

    static void createTopic(String bootstrap, String topic, int partitions) throws Exception {
        try (Admin admin = admin(bootstrap)) {
            admin.createTopics(List.of(new NewTopic(topic, partitions, (short) 1))).all().get();
            System.out.println("CREATED " + topic + " " + partitions);
        }
    }

    static long endOffsets(String bootstrap, String topic) throws Exception {
        try (Admin admin = admin(bootstrap)) {
            TopicDescription description = admin.describeTopics(List.of(topic)).allTopicNames().get().get(topic);
            Map<TopicPartition, OffsetSpec> request = new HashMap<>();
            description.partitions().forEach(p -> request.put(new TopicPartition(topic, p.partition()), OffsetSpec.latest()));
            Map<TopicPartition, ListOffsetsResult.ListOffsetsResultInfo> offsets = admin.listOffsets(request).all().get();
            return offsets.values().stream().mapToLong(ListOffsetsResult.ListOffsetsResultInfo::offset).sum();
        }
    }

    static String adId(int adIndex, int adsPerCampaign) {
        int campaign = adIndex / adsPerCampaign;
        int ad = adIndex % adsPerCampaign;
        return String.format("%08x-%04x-4000-8000-%012x", campaign, ad, adIndex);
    }

    /** Event number ``index``: its type is index mod 3 (every third event a view, as YsbFlink's generator
     * makes them), so a count of views times three is the count of events with no sampling error. */
    static String event(List<String> adIds, long now, long index) {
        ThreadLocalRandom random = ThreadLocalRandom.current();
        String ip = random.nextInt(256) + "." + random.nextInt(256) + "." + random.nextInt(256) + "." + random.nextInt(256);
        return "{\"user_id\":\"" + java.util.UUID.randomUUID() + "\",\"page_id\":\"" + java.util.UUID.randomUUID()
                + "\",\"ad_id\":\"" + adIds.get(random.nextInt(adIds.size()))
                + "\",\"ad_type\":\"" + AD_TYPES[random.nextInt(AD_TYPES.length)]
                + "\",\"event_type\":\"" + EVENT_TYPES[(int) Long.remainderUnsigned(index, EVENT_TYPES.length)]
                + "\",\"event_time\":\"" + now + "\",\"ip_address\":\"" + ip + "\"}";
    }

    static void produce(String bootstrap, String topic, int rate, int campaigns, int adsPerCampaign) throws Exception {
        List<String> adIds = java.util.stream.IntStream.range(0, campaigns * adsPerCampaign)
                .mapToObj(i -> adId(i, adsPerCampaign)).collect(Collectors.toList());
        Properties props = new Properties();
        props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ProducerConfig.ACKS_CONFIG, "1");
        props.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        props.put(ProducerConfig.BATCH_SIZE_CONFIG, "65536");
        props.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        props.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        AtomicLong acknowledged = new AtomicLong();
        AtomicLong failed = new AtomicLong();
        KafkaProducer<String, String> producer = new KafkaProducer<>(props);
        Thread main = Thread.currentThread();
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            stopping = true;
            try {
                main.join(10_000);
            } catch (InterruptedException ignored) {
                Thread.currentThread().interrupt();
            }
        }));
        long start = System.nanoTime();
        long sent = 0;
        long lastReport = System.currentTimeMillis();
        System.out.println("PRODUCING " + topic + " " + rate);
        System.out.flush();
        while (!stopping) {
            long due = (System.nanoTime() - start) / 1000L * rate / 1_000_000L;
            long now = System.currentTimeMillis();
            for (; sent < due; sent++) {
                producer.send(new ProducerRecord<>(topic, event(adIds, now, sent)), (metadata, error) -> {
                    if (error == null) {
                        acknowledged.incrementAndGet();
                    } else {
                        failed.incrementAndGet();
                    }
                });
            }
            if (now - lastReport >= 1000) {
                lastReport = now;
                System.out.println("PRODUCED " + acknowledged.get() + " " + now + " failed " + failed.get());
                System.out.flush();
            }
            Thread.sleep(5);
        }
        producer.flush();
        producer.close();
        System.out.println("PRODUCED " + acknowledged.get() + " " + System.currentTimeMillis() + " failed " + failed.get());
        System.out.println("STOPPED");
        System.out.flush();
    }

}
