package ysb;

import java.io.BufferedInputStream;
import java.io.BufferedOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.io.Serializable;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.EnumSet;
import java.util.List;
import java.util.Map;
import java.util.Set;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.catalog.SupportsWrite;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.write.DataWriter;
import org.apache.spark.sql.connector.write.LogicalWriteInfo;
import org.apache.spark.sql.connector.write.PhysicalWriteInfo;
import org.apache.spark.sql.connector.write.Write;
import org.apache.spark.sql.connector.write.WriteBuilder;
import org.apache.spark.sql.connector.write.WriterCommitMessage;
import org.apache.spark.sql.connector.write.streaming.StreamingDataWriterFactory;
import org.apache.spark.sql.connector.write.streaming.StreamingWrite;
import org.apache.spark.sql.internal.connector.SupportsStreamingUpdateAsAppend;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * YSB's Redis sink as a Spark streaming data source: each executor task writes its rows to Redis
 * itself (the original YSB writes window counts from the workers), so the sink's CPU is spent in
 * the executor JVMs where the profiler samples it. No client library: RESP over a plain socket.
 *
 * Row layout: column 0 is the window key suffix, every other column becomes a field of the window's
 * hash; columns named campaign_id and window_start_ms also index the window per campaign (see
 * RedisOutputWriter). Options: host (127.0.0.1), port (6379), prefix ("ysb:").
 */
public final class RedisSink implements TableProvider {
    @Override
    public StructType inferSchema(CaseInsensitiveStringMap options) {
        return new StructType();
    }

    @Override
    public boolean supportsExternalMetadata() {
        return true;
    }

    @Override
    public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
        return new RedisTable(schema);
    }

    static final class RedisTable implements Table, SupportsWrite {
        private final StructType schema;

        RedisTable(StructType schema) {
            this.schema = schema;
        }

        @Override
        public String name() {
            return "ysb-redis";
        }

        @Override
        public StructType schema() {
            return schema;
        }

        @Override
        public Set<TableCapability> capabilities() {
            return EnumSet.of(TableCapability.STREAMING_WRITE);
        }

        @Override
        public WriteBuilder newWriteBuilder(LogicalWriteInfo info) {
            return new RedisWriteBuilder(info);
        }
    }

    static final class RedisWriteBuilder implements WriteBuilder, SupportsStreamingUpdateAsAppend {
        private final LogicalWriteInfo info;

        RedisWriteBuilder(LogicalWriteInfo info) {
            this.info = info;
        }

        @Override
        public Write build() {
            final StructType schema = info.schema();
            final CaseInsensitiveStringMap options = info.options();
            return new Write() {
                @Override
                public StreamingWrite toStreaming() {
                    return new RedisStreamingWrite(
                        schema,
                        options.getOrDefault("host", "127.0.0.1"),
                        Integer.parseInt(options.getOrDefault("port", "6379")),
                        options.getOrDefault("prefix", "ysb:"));
                }
            };
        }
    }

    static final class RedisStreamingWrite implements StreamingWrite {
        private final RedisWriterFactory factory;

        RedisStreamingWrite(StructType schema, String host, int port, String prefix) {
            this.factory = new RedisWriterFactory(schema, host, port, prefix);
        }

        @Override
        public StreamingDataWriterFactory createStreamingWriterFactory(PhysicalWriteInfo info) {
            return factory;
        }

        @Override
        public void commit(long epochId, WriterCommitMessage[] messages) {
        }

        @Override
        public void abort(long epochId, WriterCommitMessage[] messages) {
        }
    }

    static final class RedisWriterFactory implements StreamingDataWriterFactory, Serializable {
        private static final long serialVersionUID = 1L;
        private final StructType schema;
        private final String host;
        private final int port;
        private final String prefix;

        RedisWriterFactory(StructType schema, String host, int port, String prefix) {
            this.schema = schema;
            this.host = host;
            this.port = port;
            this.prefix = prefix;
        }

        @Override
        public DataWriter<InternalRow> createWriter(int partitionId, long taskId, long epochId) {
            return new RedisOutputWriter(schema, host, port, prefix);
        }
    }

    static final class Written implements WriterCommitMessage {
        private static final long serialVersionUID = 1L;
        final long rows;

        Written(long rows) {
            this.rows = rows;
        }
    }

    /**
     * Writes each window row as YSB's Redis sink does, one synchronous command at a time (YSB uses a
     * plain, unpipelined Jedis connection): look the window up in the campaign's hash, register it
     * there and in the campaign's window list when new, then store the window's fields:
     *   HGET   <prefix>campaign:<campaign_id> <window_start_ms>
     *   HSET   <prefix>campaign:<campaign_id> <window_start_ms> <window key>   (new windows only)
     *   LPUSH  <prefix>windows:<campaign_id> <window_start_ms>                  (new windows only)
     *   HSET   <prefix>window:<col0> <name1> <value1> ...
     * Without campaign_id/window_start_ms columns only the last command is sent.
     * The class name ends in OutputWriter so that profiles which know Spark's output writers
     * attribute it to the sink.
     */
    static final class RedisOutputWriter implements DataWriter<InternalRow> {
        private final StructField[] fields;
        private final String prefix;
        private final int campaignColumn;
        private final int windowColumn;
        private final Socket socket;
        private final OutputStream out;
        private final InputStream in;
        private long written;

        RedisOutputWriter(StructType schema, String host, int port, String prefix) {
            this.fields = schema.fields();
            this.prefix = prefix;
            this.campaignColumn = indexOf("campaign_id");
            this.windowColumn = indexOf("window_start_ms");
            try {
                socket = new Socket();
                socket.connect(new InetSocketAddress(host, port), 10_000);
                socket.setSoTimeout(30_000);
                socket.setTcpNoDelay(true);
                out = new BufferedOutputStream(socket.getOutputStream(), 16 * 1024);
                in = new BufferedInputStream(socket.getInputStream(), 16 * 1024);
            } catch (IOException e) {
                throw new RuntimeException("ysb redis sink: cannot connect to " + host + ":" + port, e);
            }
        }

        private int indexOf(String name) {
            for (int i = 1; i < fields.length; i++) {
                if (fields[i].name().equals(name)) {
                    return i;
                }
            }
            return -1;
        }

        private static byte[] utf8(String text) {
            return text.getBytes(StandardCharsets.UTF_8);
        }

        @Override
        public void write(InternalRow row) throws IOException {
            byte[] windowKey = utf8(prefix + "window:" + new String(value(row, 0), StandardCharsets.UTF_8));
            if (campaignColumn > 0 && windowColumn > 0) {
                String campaign = new String(value(row, campaignColumn), StandardCharsets.UTF_8);
                byte[] windowStart = value(row, windowColumn);
                byte[] campaignKey = utf8(prefix + "campaign:" + campaign);
                List<byte[]> lookup = new ArrayList<>(3);
                lookup.add(utf8("HGET"));
                lookup.add(campaignKey);
                lookup.add(windowStart);
                if (call(lookup) == null) {
                    List<byte[]> register = new ArrayList<>(4);
                    register.add(utf8("HSET"));
                    register.add(campaignKey);
                    register.add(windowStart);
                    register.add(windowKey);
                    call(register);
                    List<byte[]> push = new ArrayList<>(3);
                    push.add(utf8("LPUSH"));
                    push.add(utf8(prefix + "windows:" + campaign));
                    push.add(windowStart);
                    call(push);
                }
            }
            List<byte[]> args = new ArrayList<>(2 + 2 * fields.length);
            args.add(utf8("HSET"));
            args.add(windowKey);
            for (int i = 1; i < fields.length; i++) {
                args.add(utf8(fields[i].name()));
                args.add(value(row, i));
            }
            call(args);
            written++;
        }

        /** One command, one round trip; returns the reply line (null for a nil bulk reply). */
        private String call(List<byte[]> args) throws IOException {
            writeCommand(args);
            out.flush();
            int kind = in.read();
            String line = readLine();
            if (kind == -1) {
                throw new IOException("ysb redis sink: redis closed the connection");
            }
            if (kind == '-') {
                throw new IOException("ysb redis sink: redis answered an error: " + line);
            }
            if (kind == '$') {
                int length = Integer.parseInt(line);
                if (length < 0) {
                    return null;
                }
                byte[] data = new byte[length + 2];
                int read = 0;
                while (read < data.length) {
                    int n = in.read(data, read, data.length - read);
                    if (n < 0) {
                        throw new IOException("ysb redis sink: redis closed the connection");
                    }
                    read += n;
                }
                return new String(data, 0, length, StandardCharsets.UTF_8);
            }
            return line;
        }

        private byte[] value(InternalRow row, int i) {
            if (row.isNullAt(i)) {
                return new byte[0];
            }
            DataType type = fields[i].dataType();
            String text;
            if (type.equals(DataTypes.StringType)) {
                return row.getUTF8String(i).getBytes();
            } else if (type.equals(DataTypes.LongType) || type.equals(DataTypes.TimestampType)) {
                text = Long.toString(row.getLong(i));
            } else if (type.equals(DataTypes.IntegerType) || type.equals(DataTypes.DateType)) {
                text = Integer.toString(row.getInt(i));
            } else if (type.equals(DataTypes.DoubleType)) {
                text = Double.toString(row.getDouble(i));
            } else {
                text = String.valueOf(row.get(i, type));
            }
            return text.getBytes(StandardCharsets.UTF_8);
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
        public WriterCommitMessage commit() throws IOException {
            return new Written(written);
        }

        @Override
        public void abort() {
        }

        @Override
        public void close() throws IOException {
            socket.close();
        }
    }
}
