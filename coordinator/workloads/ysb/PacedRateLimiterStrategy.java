package ysb;

import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionStage;
import java.util.concurrent.TimeUnit;

import org.apache.flink.api.connector.source.SourceSplit;
import org.apache.flink.api.connector.source.util.ratelimit.RateLimiter;
import org.apache.flink.api.connector.source.util.ratelimit.RateLimiterStrategy;

/**
 * A generator's pace: ``perSecond`` events over all subtasks, for the YSB job (YsbFlink) and the test jobs
 * with a known source rate (tests/workloads/RateWindowJob.java, ChainJob.java), compiled into each one's jar.
 * Flink's RateLimiterStrategy.perSecond hands every single record to a limiter thread (a Guava RateLimiter
 * behind CompletableFuture.runAsync); at 10 000 records/s per subtask those hand-offs cost more CPU than the
 * YSB steps and would own the profile. This one lets records through while the subtask is not ahead of its
 * schedule and pauses it (one delayed future) when it is 10 ms ahead: at most 100 hand-offs per second. A
 * subtask that falls behind catches up by at most one second of events (a fixed offered load, no unbounded
 * burst).
 */
public final class PacedRateLimiterStrategy<S extends SourceSplit> implements RateLimiterStrategy<S> {
    private static final long serialVersionUID = 1L;
    private final double perSecond;

    public PacedRateLimiterStrategy(double perSecond) {
        this.perSecond = perSecond;
    }

    @Override
    public RateLimiter<S> createRateLimiter(int parallelism) {
        return new PacedRateLimiter<>(perSecond / Math.max(1, parallelism));
    }

    static final class PacedRateLimiter<S extends SourceSplit> implements RateLimiter<S> {
        private static final long PAUSE_NANOS = 10_000_000L;
        private static final long MAX_DEBT_NANOS = 1_000_000_000L;
        private static final CompletableFuture<Void> NOW = CompletableFuture.completedFuture(null);
        private final double nanosPerPermit;
        private long due = Long.MIN_VALUE;

        PacedRateLimiter(double perSecond) {
            this.nanosPerPermit = 1e9 / perSecond;
        }

        @Override
        public CompletionStage<Void> acquire(int permits) {
            long now = System.nanoTime();
            if (due == Long.MIN_VALUE || now - due > MAX_DEBT_NANOS) {
                due = now;
            }
            due += (long) (permits * nanosPerPermit);
            long ahead = due - now;
            if (ahead < PAUSE_NANOS) {
                return NOW;
            }
            // Completed on the delay scheduler's own thread: on a host with fewer than 3 cores the
            // default executor of CompletableFuture starts a new thread per task.
            return CompletableFuture.runAsync(
                () -> { }, CompletableFuture.delayedExecutor(ahead, TimeUnit.NANOSECONDS, Runnable::run));
        }
    }
}
