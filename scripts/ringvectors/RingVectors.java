// Prints tests/test_ring.py's Jedis reference vectors (JAVA_RING_WEIGHTS to JAVA_SURROGATE_PAIR),
// computed the way Jedis 2.x's ShardedJedis places a key, with nothing but the JDK:
//
//   javac -d /tmp/ringvectors scripts/ringvectors/RingVectors.java
//   java -cp /tmp/ringvectors RingVectors
//
// (scripts/ringvectors/check.sh runs both and diffs the output against tests/test_ring.py.)
//
// What it reproduces, from Jedis's redis.clients.util.MurmurHash and Sharded: hash64A reads the
// bytes as little-endian longs, seed 0x1234ABCD, in Java's wrapping signed `long` arithmetic with
// unsigned shifts (>>>); a String key is hashed as String.getBytes(UTF-8) (SafeEncoder), which
// turns a lone surrogate into '?'; the ring is a TreeMap<Long, shard> holding, for the shard at
// list index i with weight w, the hashes of "SHARD-{i}-NODE-{n}" for n < 160 * w (unnamed
// shards), put in list order so that on equal hashes the later shard wins; a key belongs to the
// first node at or after its hash (tailMap(hash).firstKey()), else to the first node (wrap).
// Our own code, written from that description; no Jedis jar is needed.

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.SortedMap;
import java.util.TreeMap;

public final class RingVectors {
    static final int SEED = 0x1234ABCD;
    static final int[][] WEIGHTS = {{1, 1}, {1, 1, 1}, {1, 1, 1, 1}, {1, 2, 3}};

    // Text keys: hashed as Java encodes them (String.getBytes(UTF-8)).
    static final String[] TEXT = {
        "", "a", "key", "foo", "bar", "user:1", "user:42:profile", "SHARD-0-NODE-0",
        "0123456", "01234567", "012345678", "0123456789abcdef", "0123456789abcdefg",
        "caf\u00e9", "\u65e5\u672c\u8a9e\u30ad\u30fc", "emoji:\ud83d\ude00", "lone:\ud800:x",
        "tab\there\n", "session:0123456789012345678901234567890123456789ab",
    };
    // Byte keys: random bytes, two of every length from 1 to 17 (drawn once, kept as committed),
    // then nine 0xff bytes (every byte sign-extends in a naive Java port).
    static final String[] BYTES_HEX = {
        "58", "d2", "3c7f", "5503", "4e45ad", "f8c86c", "e70ec538", "704a56b3", "8e730035ba",
        "9ea5f73499", "c5fcca8498f1", "77ef3a31f6c1", "95cd27ad220eec", "cecb0b7dad2eae",
        "888e2748e295a36d", "5634c0ee62fe6140", "4133665c79bcf27470", "fe33df8cf4c80d2a07",
        "bf1f4f39b211a3ba1738", "d0d1df19fb0ae4bd3bdd", "59ed106f1bd07e6c06a296",
        "67245184d39dee0e5df6b1", "3ca806dad74569807d9ac4e7", "97e6b5680e8892bf05422879",
        "e2665c0bfb166960d22af80a88", "17879738d5ba8a05d3f98a3097",
        "e9b8204ba9d58415af5ca09ecbb3", "550c5b6b97dc218fe24815792876",
        "3c8f4517078ab0699db6e4165d5e39", "5680416581c71ea6dc0ef0ce4a231c",
        "673d142edcd1be9db7e69729c38b03be", "b1605dab9afbf757f79bd41793111f90",
        "a9c14cce92b156b8eba66373c330b5f5ed", "cfa585877cb597ef1ce7828874e704f2b8",
        "ffffffffffffffffff",
    };

    /** MurmurHash64A over the whole array, as Jedis's hash64A(ByteBuffer, seed). */
    static long hash64A(byte[] data) {
        ByteBuffer buf = ByteBuffer.wrap(data).order(ByteOrder.LITTLE_ENDIAN);
        final long m = 0xc6a4a7935bd1e995L;
        final int r = 47;
        long h = SEED ^ (buf.remaining() * m);
        while (buf.remaining() >= 8) {
            long k = buf.getLong();
            k *= m;
            k ^= k >>> r;
            k *= m;
            h ^= k;
            h *= m;
        }
        if (buf.remaining() > 0) {
            ByteBuffer tail = ByteBuffer.allocate(8).order(ByteOrder.LITTLE_ENDIAN);
            tail.put(buf).rewind();
            h ^= tail.getLong();
            h *= m;
        }
        h ^= h >>> r;
        h *= m;
        h ^= h >>> r;
        return h;
    }

    static long hash(String key) {
        return hash64A(key.getBytes(StandardCharsets.UTF_8));
    }

    static TreeMap<Long, Integer> ring(int[] weights) {
        TreeMap<Long, Integer> nodes = new TreeMap<>();
        for (int i = 0; i != weights.length; ++i) {
            for (int n = 0; n < 160 * weights[i]; n++) {
                nodes.put(hash("SHARD-" + i + "-NODE-" + n), i);
            }
        }
        return nodes;
    }

    static int shard(TreeMap<Long, Integer> nodes, byte[] key) {
        SortedMap<Long, Integer> tail = nodes.tailMap(hash64A(key));
        return tail.isEmpty() ? nodes.get(nodes.firstKey()) : tail.get(tail.firstKey());
    }

    static String hex(byte[] data) {
        StringBuilder out = new StringBuilder();
        for (byte b : data) {
            out.append(String.format("%02x", b & 0xff));
        }
        return out.toString();
    }

    static byte[] unhex(String text) {
        byte[] out = new byte[text.length() / 2];
        for (int i = 0; i < out.length; i++) {
            out[i] = (byte) Integer.parseInt(text.substring(2 * i, 2 * i + 2), 16);
        }
        return out;
    }

    /** A Java string as a Python literal: ASCII as is, every other UTF-16 unit as \\uXXXX. */
    static String pyString(String text) {
        StringBuilder out = new StringBuilder("\"");
        for (char c : text.toCharArray()) {
            out.append(c >= 0x20 && c < 0x7f ? String.valueOf(c) : String.format("\\u%04x", (int) c));
        }
        return out.append('"').toString();
    }

    static String shards(List<TreeMap<Long, Integer>> rings, byte[] key) {
        List<String> out = new ArrayList<>();
        for (TreeMap<Long, Integer> nodes : rings) {
            out.add(String.valueOf(shard(nodes, key)));
        }
        return "(" + String.join(", ", out) + ")";
    }

    public static void main(String[] args) {
        List<TreeMap<Long, Integer>> rings = new ArrayList<>();
        List<String> weights = new ArrayList<>();
        List<String> counts = new ArrayList<>();
        for (int[] w : WEIGHTS) {
            rings.add(ring(w));
            List<String> parts = new ArrayList<>();
            for (int x : w) {
                parts.add(String.valueOf(x));
            }
            weights.add("[" + String.join(", ", parts) + "]");
            counts.add(String.valueOf(rings.get(rings.size() - 1).size()));
        }
        List<byte[]> keys = new ArrayList<>();
        for (String text : TEXT) {
            keys.add(text.getBytes(StandardCharsets.UTF_8));
        }
        for (String text : BYTES_HEX) {
            keys.add(unhex(text));
        }
        System.out.println("JAVA_RING_WEIGHTS = (" + String.join(", ", weights) + ")");
        System.out.println("JAVA_VECTORS = [");
        for (byte[] key : keys) {
            String hexKey = "\"" + hex(key) + "\"";
            String line = "    (" + hexKey + ", " + hash64A(key) + ", " + shards(rings, key) + "),";
            if (line.length() <= 100) {
                System.out.println(line);
            } else { // as ruff format splits a tuple too long for one line
                System.out.println("    (");
                System.out.println("        " + hexKey + ",");
                System.out.println("        " + hash64A(key) + ",");
                System.out.println("        " + shards(rings, key) + ",");
                System.out.println("    ),");
            }
        }
        System.out.println("]");
        byte[] big = new byte[1000];
        for (int i = 0; i < big.length; i++) {
            big[i] = (byte) ((i * 31 + 7) & 0xff);
        }
        System.out.println("# A 1000-byte key generated identically on the JVM.");
        System.out.println("JAVA_BIG_KEY = (bytes((i * 31 + 7) & 0xFF for i in range(1000)), "
                + hash64A(big) + ", " + shards(rings, big) + ")");
        System.out.println("# Java's String.getBytes(UTF-8) for strings Python cannot encode strictly.");
        String lone = "lone:\ud800:x";
        String pair = "emoji:\ud83d\ude00";
        System.out.println("JAVA_LONE_SURROGATE = (" + pyString(lone) + ", " + hash(lone) + ")");
        System.out.println("JAVA_SURROGATE_PAIR = (" + pyString(pair) + ", " + hash(pair) + ")");
        // Not part of the block: what test_node_hash_and_count_match_jvm asserts.
        System.err.println("ring nodes per weights: " + String.join(" ", counts));
    }
}
