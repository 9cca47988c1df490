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
 * Row layout: column 0 is the key suffix; every other column becomes a hash field:
 *   HSET <prefix><col0> <name1> <value1> <name2> <value2> ...
 * Options: host (127.0.0.1), port (6379), prefix ("ysb:").
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
            return new RedisDataWriter(schema, host, port, prefix);
        }
    }

    static final class Written implements WriterCommitMessage {
        private static final long serialVersionUID = 1L;
        final long rows;

        Written(long rows) {
            this.rows = rows;
        }
    }

    /** Pipelines one HSET per row and reads all replies at commit. */
    static final class RedisDataWriter implements DataWriter<InternalRow> {
        private final StructField[] fields;
        private final byte[] prefix;
        private final Socket socket;
        private final OutputStream out;
        private final InputStream in;
        private long pending;
        private long written;

        RedisDataWriter(StructType schema, String host, int port, String prefix) {
            this.fields = schema.fields();
            this.prefix = prefix.getBytes(StandardCharsets.UTF_8);
            try {
                socket = new Socket();
                socket.connect(new InetSocketAddress(host, port), 10_000);
                socket.setSoTimeout(30_000);
                out = new BufferedOutputStream(socket.getOutputStream(), 64 * 1024);
                in = new BufferedInputStream(socket.getInputStream(), 16 * 1024);
            } catch (IOException e) {
                throw new RuntimeException("ysb redis sink: cannot connect to " + host + ":" + port, e);
            }
        }

        @Override
        public void write(InternalRow row) throws IOException {
            List<byte[]> args = new ArrayList<>(2 + 2 * fields.length);
            args.add("HSET".getBytes(StandardCharsets.US_ASCII));
            byte[] key = value(row, 0);
            byte[] fullKey = new byte[prefix.length + key.length];
            System.arraycopy(prefix, 0, fullKey, 0, prefix.length);
            System.arraycopy(key, 0, fullKey, prefix.length, key.length);
            args.add(fullKey);
            for (int i = 1; i < fields.length; i++) {
                args.add(fields[i].name().getBytes(StandardCharsets.UTF_8));
                args.add(value(row, i));
            }
            writeCommand(args);
            pending++;
            written++;
            if (pending >= 512) {
                drainReplies();
            }
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

        private void drainReplies() throws IOException {
            out.flush();
            for (; pending > 0; pending--) {
                int kind = in.read();
                String line = readLine();
                if (kind == '-') {
                    throw new IOException("ysb redis sink: redis answered an error: " + line);
                }
                if (kind == -1) {
                    throw new IOException("ysb redis sink: redis closed the connection");
                }
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
            drainReplies();
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
