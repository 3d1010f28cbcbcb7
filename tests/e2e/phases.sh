#!/bin/sh
# The typical operations of a workload, one phase each (run by test_posix_phases.py in the
# guest, in the mounted export, with busybox). Each phase starts with a LOOKUP of
# ".kc_phase_NAME" (it does not exist: NFS3ERR_NOENT), which marks where the phase begins in a
# capture of the traffic. Needs a writable export; creates and removes .kc_work/ and leaves the
# rest untouched. Exits 0: what each phase did is checked by posix_phases.sh.
mark() { stat ".kc_phase_$1" > /dev/null 2>&1; }
W=.kc_work
mark ls;      ls -lR > /dev/null
mark read;    find . -type f ! -path "./$W/*" -exec cat {} + > /dev/null
mark reread;  find . -type f ! -path "./$W/*" -exec cat {} + > /dev/null   # page cache: revalidation only
mark mkdir;   mkdir "$W"
mark create;  : > "$W/empty"
mark write;   echo "hello from the guest" > "$W/small.txt"
              dd if=/dev/zero of="$W/big.bin" bs=65536 count=64 2> /dev/null   # 4 MiB, close => COMMIT
mark append;  echo more >> "$W/small.txt"
mark setattr; chmod 600 "$W/small.txt"; touch -d @1700000000 "$W/small.txt"; truncate -s 100 "$W/big.bin"
mark rename;  mv "$W/small.txt" "$W/renamed.txt"
mark symlink; ln -s renamed.txt "$W/sym"; readlink "$W/sym" > /dev/null
mark link;    ln "$W/renamed.txt" "$W/hard" 2> /dev/null
mark statfs;  df . > /dev/null 2>&1; stat -f . > /dev/null 2>&1
mark rm;      rm -f "$W/renamed.txt" "$W/big.bin" "$W/sym" "$W/hard" "$W/empty"
mark rmdir;   rmdir "$W"
mark end
exit 0
