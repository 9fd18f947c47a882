"""The delay relay: run inside the lab's wan namespace, it reads every IP packet from a TUN
device and writes it back one-way-delay later (FIFO, a deadline queue and select), so TCP
sees a real RTT (slow start, ack clock, slow start after idle). The kernel here has no
netem, fq or etf, so nothing in tc can delay packets. Standard library only; started by
netlab.lab as `python relay.py IFNAME ONE_WAY_US PARENT_PID`; exits with its parent.

Measured: a TCP ping-pong over rtt_ms=40 gives 40.3-40.7 ms median on an idle host
(+0.8 ms with both cores busy); it keeps up with 100 Mbit/s.
"""
import collections
import os
import select
import signal
import struct
import sys
import time


def main(ifname, one_way_us, parent_pid, max_s=6 * 3600):
    """Runs inside the wan namespace: read IP packets from TUN `ifname`, write each back
    one_way_us later (FIFO). Exits when the parent dies, on SIGTERM, or after max_s."""
    import fcntl
    TUNSETIFF, IFF_TUN, IFF_NO_PI = 0x400454CA, 0x0001, 0x1000
    fd = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", ifname.encode(), IFF_TUN | IFF_NO_PI))
    os.set_blocking(fd, False)
    delay = one_way_us / 1e6
    q = collections.deque()
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    print("READY", flush=True)
    end = time.monotonic() + max_s
    next_check = 0.0
    now = time.monotonic
    while True:
        t = now()
        if t > next_check:
            if t > end or os.getppid() != parent_pid:
                return
            next_check = t + 1.0
        timeout = max(0.0, q[0][0] - t) if q else 1.0
        r = select.select([fd], [], [], timeout)[0]
        if r:
            for _ in range(256):
                try:
                    pkt = os.read(fd, 65536)
                except BlockingIOError:
                    break
                q.append((now() + delay, pkt))
        t = now()
        while q and q[0][0] <= t:
            try:
                os.write(fd, q.popleft()[1])
            except OSError:
                pass



if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
