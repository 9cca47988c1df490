package com.example.churn;

/** Template class: CodeChurn defines a fresh copy of it per generation (never on the class path). */
public final class ChurnAlpha {
    public static long burn(long deadline, long seed) {
        long x = seed;
        do {
            for (int i = 0; i < 2000; i++) {
                x ^= x << 13; x ^= x >>> 7; x ^= x << 17;
            }
        } while (System.nanoTime() < deadline);
        return x;
    }
}
