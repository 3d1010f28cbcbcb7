# pjdfstest (the POSIX syscall suite) in the e2e guest, inside the NFS mount (tests/e2e/
# test_pjdfstest.py). /job holds the suite's unmodified archive, a static build of its
# ``pjdfstest`` binary and an ``openssl`` stand-in (the suite makes names with
# ``openssl md5``; busybox has md5sum). $PJD_TESTS: the test files to run, relative to
# tests/ (e.g. "chmod/00.t mkfifo/00.t"). Per file it prints
#   PJD <file> plan=<cases> ok=<passed> notok=<failed>
# and up to 60 "PJDFAIL <file> not ok ..." lines; then the .nfsXXXX names left behind.
# $PJD_EXPORT: the export to mount (default /data).
set -u
PJD=/tmp/pjd
mkdir -p "$PJD" /tmp/bin
( cd "$PJD" && tar xzf /job/pjdfstest.tar.gz ) || { echo "PJD_ERROR no archive"; exit 8; }
cp /job/pjdfstest "$PJD/pjdfstest/pjdfstest" && chmod 755 "$PJD/pjdfstest/pjdfstest"
cp /job/openssl /tmp/bin/openssl && chmod 755 /tmp/bin/openssl
export PATH="/tmp/bin:$PATH"
# The suite's configuration file asks the OS and the file system's type (busybox df has no
# -T); set them by hand, as its comment says.
printf 'os=Linux\nGREP=grep\nfs=NFS\n' > "$PJD/pjdfstest/tests/conf"
umask 022
# The suite asks for the users root and nobody (id -u nobody); the initramfs has no passwd.
mkdir -p /etc
printf 'root:x:0:0:root:/:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' > /etc/passwd
printf 'root:x:0:\nnogroup:x:65534:\n' > /etc/group

nfs_mount "${PJD_EXPORT:-/data}" /mnt/data || { echo "PJD_ERROR mount"; exit 9; }
mkdir -p /mnt/data/pjd && cd /mnt/data/pjd || exit 10
for t in $PJD_TESTS; do
	out=$(sh "$PJD/pjdfstest/tests/$t" 2>&1)
	plan=$(echo "$out" | grep -m1 -E '^1\.\.[0-9]+' | cut -d. -f3)
	# as prove counts: "not ok N # TODO" is an expected failure, a pass
	ok=$(echo "$out" | grep -cE '^ok |^not ok [0-9]+ # TODO')
	notok=$(echo "$out" | grep '^not ok ' | grep -cv '^not ok [0-9]* # TODO')
	echo "PJD $t plan=${plan:-0} ok=$ok notok=$notok"
	echo "$out" | grep '^not ok ' | grep -v '^not ok [0-9]* # TODO' | head -60 \
		| sed "s|^|PJDFAIL $t |"
	cd /mnt/data/pjd || exit 10
done
sync
left=$(find /mnt/data/pjd -name '.nfs*' 2>/dev/null | wc -l)
echo "PJD_LEFT $left"
rm -rf /mnt/data/pjd/* 2>/dev/null
echo "PJD_DONE"
