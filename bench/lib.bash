# Shared by the benchmark scripts (sourced).

# Starts a measurement from an empty page cache where we may drop it: an
# image filled by one sequential write leaves large folios behind, and 4k
# writes into those cost the file system several times more than writes
# into a cold file, for every system alike.
drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true; }
