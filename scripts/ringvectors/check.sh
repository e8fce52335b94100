#!/bin/sh
# Compiles and runs RingVectors.java (JDK only, no jars) and diffs its output against the vectors
# committed in tests/test_ring.py: no output from diff and "identical" means they match.
# Usage, from the repository root: sh scripts/ringvectors/check.sh
set -eu
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
javac -d "$out" scripts/ringvectors/RingVectors.java
java -cp "$out" RingVectors > "$out/vectors.txt"
sed -n '/^JAVA_RING_WEIGHTS/,/^JAVA_SURROGATE_PAIR/p' tests/test_ring.py > "$out/committed.txt"
diff -u "$out/committed.txt" "$out/vectors.txt"
echo "identical: $(wc -l < "$out/vectors.txt") lines"
