#!/bin/sh
# Guest-side check of the write path with the Linux NFS client (run by test_posix_phases.py in
# the guest, in the mounted export, as root, with busybox). The same phases as phases.sh, each
# checked against what a local file system does; one line per phase: "PHASE <name> ok" or
# "PHASE <name> FAIL <why>". Between phases the page cache is dropped, so reads go to the
# server. /job/pattern.bin is bytes(range(256)) * 16384 (4 MiB), put there by the host.
# Leaves keep/ (small.txt, big.bin, sym) for the host to compare with the bucket.
W=.kc_check
ok() { echo "PHASE $1 ok"; }
fail() { echo "PHASE $1 FAIL $2"; }
drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }

cp /job/pattern.bin /tmp/big   # 4 MiB, known to the host

# mkdir
if mkdir "$W" && [ -d "$W" ] && mkdir keep; then ok mkdir; else fail mkdir "mkdir"; fi
if mkdir "$W" 2>/dev/null; then fail mkdir "second mkdir succeeded"; fi

# create
if : > "$W/empty" && [ -f "$W/empty" ] && [ ! -s "$W/empty" ]; then ok create; else fail create "empty file"; fi

# write (a small file, a 4 MiB file; close => COMMIT)
echo "hello from the guest" > "$W/small.txt"
dd if=/tmp/big of="$W/big.bin" bs=65536 2>/dev/null
drop
if [ "$(cat "$W/small.txt")" = "hello from the guest" ] && cmp -s /tmp/big "$W/big.bin" \
   && [ "$(stat -c %s "$W/big.bin")" = 4194304 ]; then ok write; else fail write "content"; fi

# append
echo more >> "$W/small.txt"
drop
if [ "$(cat "$W/small.txt")" = "$(printf 'hello from the guest\nmore')" ]; then ok append; else fail append "$(cat "$W/small.txt" | head -c 80)"; fi

# setattr: chmod, mtime, truncate (shrink, then extend with zeros)
why=""
chmod 600 "$W/small.txt" || why="$why chmod"
touch -d @1700000000 "$W/small.txt" || why="$why touch"
truncate -s 100 "$W/big.bin" || why="$why truncate"
drop
[ "$(stat -c %a "$W/small.txt")" = 600 ] || why="$why mode=$(stat -c %a "$W/small.txt")"
[ "$(stat -c %Y "$W/small.txt")" = 1700000000 ] || why="$why mtime=$(stat -c %Y "$W/small.txt")"
[ "$(stat -c %s "$W/big.bin")" = 100 ] || why="$why size=$(stat -c %s "$W/big.bin")"
head -c 100 /tmp/big | cmp -s - "$W/big.bin" || why="$why truncated-content"
truncate -s 200 "$W/big.bin" || why="$why extend"
drop
{ head -c 100 /tmp/big; head -c 100 /dev/zero; } | cmp -s - "$W/big.bin" || why="$why extended-content"
if [ -z "$why" ]; then ok setattr; else fail setattr "$why"; fi

# rename (onto a new name, then over an existing file)
why=""
mv "$W/small.txt" "$W/renamed.txt" || why="$why mv"
[ ! -e "$W/small.txt" ] || why="$why old-name-still-there"
echo other > "$W/other.txt"
mv "$W/renamed.txt" "$W/other.txt" || why="$why mv-over"
drop
[ ! -e "$W/renamed.txt" ] || why="$why source-still-there"
[ "$(cat "$W/other.txt")" = "$(printf 'hello from the guest\nmore')" ] || why="$why target-content"
[ "$(stat -c %a "$W/other.txt")" = 600 ] || why="$why target-mode"
if [ -z "$why" ]; then ok rename; else fail rename "$why"; fi

# symlink (+ readlink, + following it)
why=""
ln -s other.txt "$W/sym" || why="$why ln-s"
[ "$(readlink "$W/sym")" = other.txt ] || why="$why readlink"
[ -L "$W/sym" ] || why="$why not-a-link"
drop
[ "$(cat "$W/sym")" = "$(printf 'hello from the guest\nmore')" ] || why="$why follow"
if [ -z "$why" ]; then ok symlink; else fail symlink "$why"; fi

# link: not supported by an object store
err=$(ln "$W/other.txt" "$W/hard" 2>&1)
if [ -e "$W/hard" ]; then fail link "hard link created"; else echo "PHASE link notsupp $err"; fi

# statfs
if df . > /dev/null 2>&1 && stat -f . > /dev/null 2>&1; then ok statfs; else fail statfs "df/stat -f"; fi

# keep a copy for the host to check
cp "$W/other.txt" keep/small.txt && cp /tmp/big keep/big.bin && ln -s small.txt keep/sym

# rm
why=""
rm -f "$W/other.txt" "$W/big.bin" "$W/sym" "$W/empty" || why="$why rm"
drop
[ -z "$(ls -A "$W")" ] || why="$why left:$(ls -A "$W" | tr '\n' ,)"
[ ! -e "$W/other.txt" ] || why="$why still-there"
if [ -z "$why" ]; then ok rm; else fail rm "$why"; fi

# rmdir (a non-empty directory first)
why=""
mkdir "$W/d" && : > "$W/d/f"
err=$(rmdir "$W/d" 2>&1) && why="$why non-empty-removed"
case "$err" in *"not empty"*) ;; *) why="$why err=$err" ;; esac
rm "$W/d/f" && rmdir "$W/d" || why="$why rmdir-d"
rmdir "$W" || why="$why rmdir-W"
drop
[ ! -e "$W" ] || why="$why still-there"
ls -la > /dev/null || why="$why ls"
if [ -z "$why" ]; then ok rmdir; else fail rmdir "$why"; fi
echo "PHASES DONE"
