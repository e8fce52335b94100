// A small driver for Jedis 2.9.0's ShardedJedis, run by tests/java/test_jedis.py: the shards are
// the masters the sentinels name, in the order given (as ShardedJedisSentinelPool builds them:
// unnamed JedisShardInfo, weight 1, Hashing.MURMUR_HASH). Reads one command a line on stdin and
// answers one line on stdout; keys and values travel as hex, so every byte is compared as stored.
//
//   resolve                  ask the sentinels again, rebuild the ShardedJedis; "host:port ..."
//   where K...               the index (in the master list) of each key's shard
//   set K V K V ...          SET each pair (pipelined); "ok n"
//   setex SECONDS K V ...    SETEX each pair; "ok n"
//   get K...                 GET each key (pipelined); hex values, "-" for a miss
//   incr K / ttl K           the reply, as a decimal
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

import redis.clients.jedis.Jedis;
import redis.clients.jedis.JedisShardInfo;
import redis.clients.jedis.ShardedJedis;
import redis.clients.jedis.ShardedJedisPipeline;
import redis.clients.util.Hashing;

public final class ShardedDriver {
    private final List<String> masters;
    private final List<String> sentinels;
    private List<JedisShardInfo> shards = new ArrayList<>();
    private ShardedJedis jedis;

    private ShardedDriver(List<String> masters, List<String> sentinels) {
        this.masters = masters;
        this.sentinels = sentinels;
    }

    private JedisShardInfo master(String name) {
        for (String sentinel : sentinels) {
            int colon = sentinel.lastIndexOf(':');
            Jedis asked = new Jedis(sentinel.substring(0, colon), Integer.parseInt(sentinel.substring(colon + 1)));
            try {
                List<String> address = asked.sentinelGetMasterAddrByName(name);
                if (address != null && address.size() == 2) {
                    return new JedisShardInfo(address.get(0), Integer.parseInt(address.get(1)));
                }
            } catch (RuntimeException e) {
                // this sentinel does not answer: ask the next
            } finally {
                asked.close();
            }
        }
        throw new IllegalStateException("no sentinel names master " + name);
    }

    private String resolve() {
        if (jedis != null) {
            jedis.close();
        }
        shards = new ArrayList<>();
        StringBuilder out = new StringBuilder();
        for (String name : masters) {
            JedisShardInfo shard = master(name);
            shards.add(shard);
            out.append(out.length() == 0 ? "" : " ").append(shard.getHost()).append(':').append(shard.getPort());
        }
        jedis = new ShardedJedis(shards, Hashing.MURMUR_HASH);
        return out.toString();
    }

    private int index(byte[] key) {
        JedisShardInfo info = jedis.getShardInfo(key);
        for (int i = 0; i < shards.size(); i++) {
            if (shards.get(i) == info) {
                return i;
            }
        }
        throw new IllegalStateException("a shard not in the list");
    }

    private String run(String[] words) {
        String command = words[0];
        List<byte[]> args = new ArrayList<>();
        int first = command.equals("setex") ? 2 : 1;
        for (int i = first; i < words.length; i++) {
            args.add(unhex(words[i]));
        }
        StringBuilder out = new StringBuilder();
        switch (command) {
            case "resolve":
                return resolve();
            case "where":
                for (byte[] key : args) {
                    out.append(out.length() == 0 ? "" : " ").append(index(key));
                }
                return out.toString();
            case "set":
            case "setex": {
                ShardedJedisPipeline pipe = jedis.pipelined();
                for (int i = 0; i + 1 < args.size(); i += 2) {
                    if (command.equals("set")) {
                        pipe.set(args.get(i), args.get(i + 1));
                    } else {
                        pipe.setex(args.get(i), Integer.parseInt(words[1]), args.get(i + 1));
                    }
                }
                pipe.sync();
                return "ok " + args.size() / 2;
            }
            case "get": {
                ShardedJedisPipeline pipe = jedis.pipelined();
                for (byte[] key : args) {
                    pipe.get(key);
                }
                for (Object value : pipe.syncAndReturnAll()) {
                    out.append(out.length() == 0 ? "" : " ").append(value == null ? "-" : hex((byte[]) value));
                }
                return out.toString();
            }
            case "incr":
                return String.valueOf(jedis.incr(args.get(0)));
            case "ttl":
                return String.valueOf(jedis.ttl(args.get(0)));
            default:
                throw new IllegalArgumentException("unknown command " + command);
        }
    }

    private static byte[] unhex(String text) {
        byte[] bytes = new byte[text.length() / 2];
        for (int i = 0; i < bytes.length; i++) {
            bytes[i] = (byte) Integer.parseInt(text.substring(2 * i, 2 * i + 2), 16);
        }
        return bytes;
    }

    private static String hex(byte[] bytes) {
        StringBuilder out = new StringBuilder();
        for (byte b : bytes) {
            out.append(String.format("%02x", b & 0xff));
        }
        return out.toString();
    }

    /** Arguments: the master names, comma-separated, in ring order; the sentinels, host:port,... */
    public static void main(String[] args) throws Exception {
        ShardedDriver driver = new ShardedDriver(Arrays.asList(args[0].split(",")), Arrays.asList(args[1].split(",")));
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.US_ASCII));
        PrintStream out = new PrintStream(System.out, false, "US-ASCII");
        String line;
        while ((line = in.readLine()) != null) {
            try {
                out.println(driver.run(line.trim().split(" ")));
            } catch (RuntimeException e) {
                out.println("error " + e.toString().replace('\n', ' '));
            }
            out.flush();
        }
        if (driver.jedis != null) {
            driver.jedis.close();
        }
    }
}
