package taskprof.test;


import org.apache.flink.api.common.eventtime.WatermarkStrategy;
import org.apache.flink.api.common.functions.FilterFunction;
import org.apache.flink.api.common.functions.MapFunction;
import org.apache.flink.api.common.state.ValueState;
import org.apache.flink.api.common.state.ValueStateDescriptor;
import org.apache.flink.api.common.typeinfo.Types;
import org.apache.flink.api.java.functions.KeySelector;
import org.apache.flink.api.java.tuple.Tuple3;
import org.apache.flink.api.common.functions.OpenContext;
import org.apache.flink.connector.datagen.source.DataGeneratorSource;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.streaming.api.functions.KeyedProcessFunction;
import org.apache.flink.streaming.api.functions.sink.v2.DiscardingSink;
import org.apache.flink.util.Collector;

import ysb.PacedRateLimiterStrategy;

/**
 * A Flink job whose operators the JIT is free to inline (no -XX:CompileCommand=dontinline, unlike the
 * YSB demo): small user functions that C2 folds into Flink's chaining code, each doing a known amount
 * of arithmetic per record so that the operators, not only Flink's runtime, hold the CPU:
 *
 *   Source: Orders -> ParseOrder (map) -> ValidOrder (filter) -> PriceOrder (map)
 *     -> keyBy -> RunningTotal (keyed process, value state) -> Discard (sink)
 *
 * The source is paced by the YSB demo's PacedRateLimiterStrategy (compiled into the same jar).
 *
 * usage: ChainJob [--rate N] [--parallelism 2] [--work N]
 */
public final class ChainJob {
    private ChainJob() {
    }

    public static void main(String[] argv) throws Exception {
        int rate = 10_000;
        int parallelism = 2;
        int work = 400;
        for (int i = 0; i + 1 < argv.length; i += 2) {
            switch (argv[i]) {
                case "--rate": rate = Integer.parseInt(argv[i + 1]); break;
                case "--parallelism": parallelism = Integer.parseInt(argv[i + 1]); break;
                case "--work": work = Integer.parseInt(argv[i + 1]); break;
                default: throw new IllegalArgumentException("unknown option " + argv[i]);
            }
        }
        StreamExecutionEnvironment env = StreamExecutionEnvironment.getExecutionEnvironment();
        env.setParallelism(parallelism);
        DataGeneratorSource<Long> source = new DataGeneratorSource<>(
            index -> index, Long.MAX_VALUE, new PacedRateLimiterStrategy<>(rate), Types.LONG);
        env.fromSource(source, WatermarkStrategy.noWatermarks(), "Orders")
            .map(new ParseOrder(work)).name("ParseOrder")
            .filter(new ValidOrder(work)).name("ValidOrder")
            .map(new PriceOrder(work)).name("PriceOrder")
            .keyBy(new ByCustomer())
            .process(new RunningTotal(work)).name("RunningTotal")
            .sinkTo(new DiscardingSink<>()).name("Discard");
        env.execute("chain-job");
    }

    /** Mixes ``value`` ``rounds`` times: a fixed amount of CPU per call, no allocation. */
    static long mix(long value, int rounds) {
        long h = value;
        for (int i = 0; i < rounds; i++) {
            h = (h ^ (h >>> 29)) * 0xbf58476d1ce4e5b9L + i;
        }
        return h;
    }

    /** index → (customer, amount in cents, checksum). */
    public static final class ParseOrder implements MapFunction<Long, Tuple3<Long, Long, Long>> {
        private static final long serialVersionUID = 1L;
        private final int work;

        ParseOrder(int work) {
            this.work = work;
        }

        @Override
        public Tuple3<Long, Long, Long> map(Long index) {
            long h = mix(index, work);
            return Tuple3.of(index % 256, 100 + (h & 0xffff), h);
        }
    }

    /** Keeps orders whose checksum passes (about 7 in 8). */
    public static final class ValidOrder implements FilterFunction<Tuple3<Long, Long, Long>> {
        private static final long serialVersionUID = 1L;
        private final int work;

        ValidOrder(int work) {
            this.work = work;
        }

        @Override
        public boolean filter(Tuple3<Long, Long, Long> order) {
            return (mix(order.f2, work / 2) & 7) != 0;
        }
    }

    /** Adds tax and a discount to the amount. */
    public static final class PriceOrder implements MapFunction<Tuple3<Long, Long, Long>, Tuple3<Long, Long, Long>> {
        private static final long serialVersionUID = 1L;
        private final int work;

        PriceOrder(int work) {
            this.work = work;
        }

        @Override
        public Tuple3<Long, Long, Long> map(Tuple3<Long, Long, Long> order) {
            long h = mix(order.f1 ^ order.f2, work);
            return Tuple3.of(order.f0, order.f1 * 119 / 100 - (h & 15), h);
        }
    }

    public static final class ByCustomer implements KeySelector<Tuple3<Long, Long, Long>, Long> {
        private static final long serialVersionUID = 1L;

        @Override
        public Long getKey(Tuple3<Long, Long, Long> order) {
            return order.f0;
        }
    }

    /** Per customer the running total of its amounts, emitted with every order. */
    public static final class RunningTotal extends KeyedProcessFunction<Long, Tuple3<Long, Long, Long>, Long> {
        private static final long serialVersionUID = 1L;
        private final int work;
        private transient ValueState<Long> total;

        RunningTotal(int work) {
            this.work = work;
        }

        @Override
        public void open(OpenContext context) {
            total = getRuntimeContext().getState(new ValueStateDescriptor<>("total", Types.LONG));
        }

        @Override
        public void processElement(Tuple3<Long, Long, Long> order, Context context, Collector<Long> out)
                throws Exception {
            Long before = total.value();
            long now = (before == null ? 0 : before) + order.f1 + (mix(order.f2, work) & 1);
            total.update(now);
            out.collect(now);
        }
    }
}
