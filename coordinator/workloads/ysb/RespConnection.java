package ysb;

import java.io.BufferedInputStream;
import java.io.BufferedOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.io.UncheckedIOException;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

/**
 * One RESP connection to Redis: one command, one round trip (no client library). The Spark sink
 * (RedisSink.java) and the Flink job (YsbFlink.java) are compiled with it, each against its engine's jars.
 */
final class RespConnection implements AutoCloseable {
    private final Socket socket;
    private final OutputStream out;
    private final InputStream in;

    RespConnection(String host, int port) {
        try {
            socket = new Socket();
            socket.connect(new InetSocketAddress(host, port), 10_000);
            socket.setSoTimeout(30_000);
            socket.setTcpNoDelay(true);
            out = new BufferedOutputStream(socket.getOutputStream(), 16 * 1024);
            in = new BufferedInputStream(socket.getInputStream(), 16 * 1024);
        } catch (IOException e) {
            throw new UncheckedIOException("ysb redis: cannot connect to " + host + ":" + port, e);
        }
    }

    static byte[] utf8(String text) {
        return text.getBytes(StandardCharsets.UTF_8);
    }

    boolean isClosed() {
        return socket.isClosed();
    }

    /** Sends one command and returns the reply line (null for a nil bulk reply). */
    String call(List<byte[]> args) throws IOException {
        writeCommand(args);
        out.flush();
        int kind = in.read();
        String line = readLine();
        if (kind == -1) {
            throw new IOException("ysb redis: redis closed the connection");
        }
        if (kind == '-') {
            throw new IOException("ysb redis: redis answered an error: " + line);
        }
        if (kind == '$') {
            int length = Integer.parseInt(line);
            return length < 0 ? null : readBulkBody(length);
        }
        return line;
    }

    /** The whole reply of HGETALL as a map (the static ad -> campaign table). */
    Map<String, String> hgetall(byte[] key) throws IOException {
        writeCommand(List.of(utf8("HGETALL"), key));
        out.flush();
        if (in.read() != '*') {
            throw new IOException("ysb redis: HGETALL did not answer an array");
        }
        int count = Integer.parseInt(readLine());
        Map<String, String> result = new HashMap<>(Math.max(16, count));
        for (int i = 0; i + 1 < count; i += 2) {
            result.put(readBulk(), readBulk());
        }
        return result;
    }

    private String readBulk() throws IOException {
        if (in.read() != '$') {
            throw new IOException("ysb redis: expected a bulk string");
        }
        return readBulkBody(Integer.parseInt(readLine()));
    }

    private String readBulkBody(int length) throws IOException {
        byte[] data = in.readNBytes(length + 2);
        if (data.length < length + 2) {
            throw new IOException("ysb redis: redis closed the connection");
        }
        return new String(data, 0, length, StandardCharsets.UTF_8);
    }

    private void writeCommand(List<byte[]> args) throws IOException {
        out.write(('*' + Integer.toString(args.size()) + "\r\n").getBytes(StandardCharsets.US_ASCII));
        for (byte[] arg : args) {
            out.write(('$' + Integer.toString(arg.length) + "\r\n").getBytes(StandardCharsets.US_ASCII));
            out.write(arg);
            out.write('\r');
            out.write('\n');
        }
    }

    private String readLine() throws IOException {
        StringBuilder line = new StringBuilder();
        int c;
        while ((c = in.read()) != -1 && c != '\n') {
            if (c != '\r') {
                line.append((char) c);
            }
        }
        return line.toString();
    }

    @Override
    public void close() throws IOException {
        socket.close();
    }
}
