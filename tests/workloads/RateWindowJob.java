package taskprof.test;

import java.io.FileWriter;
import java.io.IOException;
import java.io.Writer;
import java.time.Duration;

import org.apache.flink.api.common.eventtime.WatermarkStrategy;
import org.apache.flink.api.common.functions.MapFunction;
import org.apache.flink.api.common.functions.ReduceFunction;
import org.apache.flink.api.common.typeinfo.Types;
import org.apache.flink.api.connector.source.SourceReaderContext;
import org.apache.flink.api.java.functions.KeySelector;
import org.apache.flink.api.java.tuple.Tuple2;
import org.apache.flink.connector.datagen.source.DataGeneratorSource;
import org.apache.flink.connector.datagen.source.GeneratorFunction;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.streaming.api.functions.sink.v2.DiscardingSink;
import org.apache.flink.streaming.api.windowing.assigners.TumblingProcessingTimeWindows;

import ysb.PacedRateLimiterStrategy;

/**
 * A Flink job with a known source rate for the event-count tests (not the YSB demo; its source is paced
 * by the demo's coordinator/workloads/ysb/PacedRateLimiterStrategy.java, compiled into the same jar):
 *
 *   GenSource (rate-limited generator of longs) -> ToKeyed -> keyBy -> 1 s window sum -> Discard
 *
 * Besides Flink's own metrics, every source subtask appends "wall_ms emitted" to
 * LEDGER_DIR/source-&lt;subtask&gt;.log every 50 ms: the job's own count of what it generated, which
 * the tests interpolate at the profiler's window ends to judge the count read from the REST API.
 *
 * usage: RateWindowJob --rate N --ledger DIR [--parallelism 2]
 */
public final class RateWindowJob {
    private RateWindowJob() {
    }

    public static void main(String[] argv) throws Exception {
        String ledger = "";
        int rate = 20_000;
        int parallelism = 2;
        for (int i = 0; i + 1 < argv.length; i += 2) {
            switch (argv[i]) {
                case "--rate": rate = Integer.parseInt(argv[i + 1]); break;
                case "--ledger": ledger = argv[i + 1]; break;
                case "--parallelism": parallelism = Integer.parseInt(argv[i + 1]); break;
                default: throw new IllegalArgumentException("unknown option " + argv[i]);
            }
        }
        StreamExecutionEnvironment env = StreamExecutionEnvironment.getExecutionEnvironment();
        env.setParallelism(parallelism);
        DataGeneratorSource<Long> source = new DataGeneratorSource<>(
            new LedgerGenerator(ledger), Long.MAX_VALUE, new PacedRateLimiterStrategy<>(rate), Types.LONG);
        env.fromSource(source, WatermarkStrategy.noWatermarks(), "GenSource")
            .map(new ToKeyed()).name("ToKeyed")
            .keyBy(new ByKey())
            .window(TumblingProcessingTimeWindows.of(Duration.ofSeconds(1)))
            .reduce(new WindowSum()).name("WindowSum")
            .sinkTo(new DiscardingSink<>()).name("Discard");
        env.execute("rate-window");
    }

    /** The record is its index; every 50 ms the subtask's count so far goes to its ledger file. */
    public static final class LedgerGenerator implements GeneratorFunction<Long, Long> {
        private static final long serialVersionUID = 1L;
        private final String ledgerDir;
        private transient Writer ledger;
        private transient long emitted;
        private transient long lastWrite;

        LedgerGenerator(String ledgerDir) {
            this.ledgerDir = ledgerDir;
        }

        @Override
        public void open(SourceReaderContext context) throws IOException {
            if (!ledgerDir.isEmpty()) {
                ledger = new FileWriter(ledgerDir + "/source-" + context.getIndexOfSubtask() + ".log", true);
            }
        }

        @Override
        public Long map(Long index) throws IOException {
            emitted++;
            long now = System.currentTimeMillis();
            if (ledger != null && now - lastWrite >= 50) {
                ledger.write(now + " " + emitted + "\n");
                ledger.flush();
                lastWrite = now;
            }
            return index;
        }

        @Override
        public void close() throws IOException {
            if (ledger != null) {
                ledger.close();
            }
        }
    }

    public static final class ToKeyed implements MapFunction<Long, Tuple2<Long, Long>> {
        private static final long serialVersionUID = 1L;

        @Override
        public Tuple2<Long, Long> map(Long value) {
            return Tuple2.of(value % 128, 1L);
        }
    }

    public static final class ByKey implements KeySelector<Tuple2<Long, Long>, Long> {
        private static final long serialVersionUID = 1L;

        @Override
        public Long getKey(Tuple2<Long, Long> value) {
            return value.f0;
        }
    }

    public static final class WindowSum implements ReduceFunction<Tuple2<Long, Long>> {
        private static final long serialVersionUID = 1L;

        @Override
        public Tuple2<Long, Long> reduce(Tuple2<Long, Long> a, Tuple2<Long, Long> b) {
            return Tuple2.of(a.f0, a.f1 + b.f1);
        }
    }
}
