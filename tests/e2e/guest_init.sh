#!/bin/busybox sh
# /init of the nfsgw e2e guest (built by tests/e2e/guest.py): load the NFS client and network
# modules, bring up QEMU user networking, run /job/run.sh with its output on the second serial
# port, report its exit status there, power off. Nothing here waits without a bound.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mount -t tmpfs tmpfs /tmp
OUT=/dev/ttyS1

finish() {
	echo "@@E2E-RC $1" > "$OUT"
	sync
	poweroff -f
	sleep 10
	echo o > /proc/sysrq-trigger
}

# Output: raw, no echo, no CR/LF translation needed on our side (the host strips CRs anyway).
stty -F "$OUT" raw -echo 2>/dev/null

while read -r m; do
	insmod "/modules/$m" || { echo "e2e-init: insmod $m failed" > "$OUT"; finish 125; }
done < /modules/order

# QEMU user networking: the guest is 10.0.2.15, this host's 127.0.0.1 is 10.0.2.2.
ip link set lo up
n=0
while [ ! -e /sys/class/net/eth0 ] && [ $n -lt 200 ]; do sleep 0.05; n=$((n + 1)); done
ip addr add 10.0.2.15/24 dev eth0 && ip link set eth0 up && ip route add default via 10.0.2.2 \
	|| { echo "e2e-init: no network" > "$OUT"; finish 125; }

. /job/env

# The helpers scripts use (see tests/e2e/guest.py).
cat > /job/lib.sh <<'EOF'
nfs_mount() { # EXPORT DIR [EXTRA_OPTIONS]
	mkdir -p "$2"
	mount -t nfs -o "$NFS_OPTS${3:+,$3}" "10.0.2.2:$1" "$2"
}
drop_caches() { # [N]
	sync
	echo "${1:-3}" > /proc/sys/vm/drop_caches
}
EOF

cd /tmp
sh -c '. /job/lib.sh; . /job/run.sh' > "$OUT" 2>&1 < /dev/null
finish $?
