"""controlplane/confine.py: the upstream kubelet kept from changing the host it shares.

Against the real kernel: a process started through ``confined_argv`` writes kernel tunables into
its copies (the host's stay as they were) while a tmpfs it mounts under a shared root dir reaches
the host's mount namespace, as the kubelet's volume mounts must reach containerd's; and the
kubelet's iptables chains come out of a network namespace's tables (a private one, not the host's).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from controlplane import confine
from devenv.hostclean import mounts_under, unmount_all


def test_a_confined_process_sets_its_copies_of_the_tunables_and_its_mounts_reach_the_host(tmp_path: Path) -> None:
    tunables, root = tmp_path / "tunables", tmp_path / "root"
    confine.copy_tunables(tunables)
    host_panic = Path("/proc/sys/kernel/panic").read_text().strip()
    wanted = "17" if host_panic != "17" else "18"
    try:
        confine.make_shared(root)
        (root / "volume").mkdir()
        script = (f"echo {wanted} > /proc/sys/kernel/panic && mount -t tmpfs tmpfs {root / 'volume'} "
                  f"&& echo secret > {root / 'volume' / 'token'}")
        done = subprocess.run(confine.confined_argv(["sh", "-c", script], tunables),
                              capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        assert Path("/proc/sys/kernel/panic").read_text().strip() == host_panic
        assert confine.tunables_written(tunables) == {"kernel/panic": wanted}
        # The namespace is gone, its tmpfs is not: the host's namespace has it, with the file.
        assert str(root / "volume") in mounts_under(root)
        assert (root / "volume" / "token").read_text() == "secret\n"
    finally:
        unmount_all(root)
    assert mounts_under(root) == []


def test_the_kubelets_iptables_chains_are_taken_out_and_nothing_else() -> None:
    script = textwrap.dedent("""
        import subprocess
        from controlplane import confine

        def ipt(*args):
            subprocess.run(["iptables", "-w", *args], check=True)

        ipt("-t", "filter", "-N", "KUBE-FIREWALL")
        ipt("-t", "filter", "-A", "KUBE-FIREWALL", "!", "-s", "127.0.0.0/8", "-d", "127.0.0.0/8",
            "-m", "comment", "--comment", "block incoming localnet connections", "-j", "DROP")
        ipt("-t", "filter", "-A", "INPUT", "-j", "KUBE-FIREWALL")
        ipt("-t", "filter", "-A", "OUTPUT", "-m", "comment", "--comment", "kubelet firewall", "-j", "KUBE-FIREWALL")
        ipt("-t", "filter", "-N", "OTHER")
        ipt("-t", "filter", "-A", "INPUT", "-j", "OTHER")
        ipt("-t", "mangle", "-N", "KUBE-IPTABLES-HINT")
        removed = confine.remove_iptables_chains()
        assert "iptables filter KUBE-FIREWALL" in removed, removed
        assert "iptables mangle KUBE-IPTABLES-HINT" in removed, removed
        left = subprocess.run(["iptables-save"], check=True, capture_output=True, text=True).stdout
        assert "KUBE-" not in left, left
        assert "-A INPUT -j OTHER" in left, left
        print("ok")
    """)
    done = subprocess.run(["unshare", "--net", sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
