#!/bin/bash
# The bundle the GPU machine needs (no package registries there), built here, as root, on Debian 12:
#
#   bash scripts/device-bundle.sh            # wheels + bcc + nft, then the sizes (what travels)
#   bash scripts/device-bundle.sh wheels     # or any of: wheels bcc nft size check
#
# Both folders are git-ignored and travel only when a device run names them in `carry`
# (carry: [".whl", ".deb"]); examples/workload/h200_setup.sh (sourced there, also by
# examples/hostlab/h200_record.sh) installs them:
#
#   .whl/            the agent's runtime dependencies (`triscope agent`, `triscope db upgrade`,
#                    `triscope export-trace`) for CPython 3.12 manylinux x86_64, pinned below, one
#                    wheel each (`make wheels` runs this step); numpy and torch are on the machine;
#                    dash/plotly/kubernetes/psycopg/gunicorn are not carried (not used there).
#                    h200_setup.sh: pip install --no-index --no-deps --target /tmp/site.
#   .deb/bcc.tar.xz  a trimmed `dpkg -x` tree of Debian 12's BCC: libbpfcc, python3-bpfcc, libllvm14,
#                    libclang-cpp14, libbpf1, and the newest linux-headers-*-{amd64,common}, unpacked
#                    by h200_setup.sh into /opt/bcc (LD_LIBRARY_PATH, PYTHONPATH, the bcc module and
#                    libbcc links, /lib/modules/$(uname -r)/{build,source} -> the carried headers).
#                    Trimmed: usr/share (docs, man pages), dev symlinks, the headers' arch/ dirs other
#                    than x86, their scripts/ and tools/ links (linux-kbuild, not carried: BCC runs no
#                    make), Module.symvers, the empty include/config/<SYMBOL> stamps, and the comments
#                    of every header (the kernel's own kheaders trim, CONFIG_IKHEADERS). BCC takes
#                    the tracepoint layouts from tracefs, so the 6.1 headers serve a newer kernel.
#                    libz3.so.4 (LLVM links it for the static analyzer's Z3 solver, which BCC never
#                    runs) is a stand-in built here from libLLVM's undefined Z3_* symbols, each one
#                    aborting if ever called, in usr/lib/bcc-compat/ (linked only where the host has
#                    no libz3.so.4); BCC_Z3=real carries the real one (+~7 MB: over 64 MiB today).
#                    usr/lib/bcc-compat/README lists the package versions. Compressed with
#                    xz --x86 (BCJ) -9e, single-threaded, sorted, fixed owners and mtimes.
#   .deb/nft/*.deb   Debian 12's nftables and its libraries (the lab drops packets with nft there);
#                    h200_setup.sh dpkg -x's them into /opt/nft where the host has no nft.
#
# What travels in all (the size step prints it): the tracked + untracked-not-ignored files of the
# working tree + .whl + .deb, under the device's 64 MiB limit (aim: < 56 MiB). Nothing else under
# .deb/ may be there when it is carried (the size step warns, e.g. an old .deb/gpu/ of raw debs).
#
# Rebuilding: bump the pins below together with the virtualenv (the wheels step warns when .venv has
# other versions: the device would run other code than the tests), rerun, then `check`, which
# proves the bundle in a Debian 12 chroot that has no BCC, LLVM, libz3 or libbpf (debootstrap;
# CHROOT=/tmp/bundle-chroot is kept between runs) with CPython 3.12 (PY312=..., default pyenv's):
# h200_setup.sh sourced as on the device, then a sched:sched_switch tracepoint and a libc uprobe
# compiled and attached with the carried BCC and headers, `triscope doctor` (every eBPF probe of
# the agent), the CUDA driver uprobes on the stand-in libcuda (cuda_probe_check --stand-in), the
# carried nft, `triscope db upgrade` and `export-trace`. It runs in a private mount namespace and
# a chroot: this host's BCC, /lib/modules links and /opt are left alone.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WHL=$ROOT/.whl
DEB=$ROOT/.deb
WORK=${WORK:-/tmp/device-bundle}
EPOCH=${SOURCE_DATE_EPOCH:-1704067200}     # 2024-01-01: fixed mtimes in the tarball
BCC_Z3=${BCC_Z3:-stub}
LIMIT=$((64 * 1024 * 1024)); AIM=$((56 * 1024 * 1024))

# name==version: the versions the virtualenv runs the tests with. Their dependencies must be here
# too (the wheels step checks every Requires-Dist for Python 3.12 on Linux x86_64); numpy and torch
# are on the device. greenlet is not: SQLAlchemy 2.1 needs it for asyncio only.
WHEELS="sqlalchemy==2.1.9 alembic==1.20.1 mako==1.4.3 markupsafe==3.0.4
  apscheduler==3.11.3 tzlocal==5.4.5 nvidia-ml-py==13.615.71 prometheus-client==0.26.0 psutil==7.2.2
  pyyaml==6.0.4 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-extensions==4.16.0
  typing-inspection==0.4.5 bcrypt==5.0.0 h11==0.16.0 h2==4.4.1 hpack==4.2.0 hyperframe==6.1.0
  opentelemetry-proto==1.45.2 protobuf==7.36.2"
ON_DEVICE="numpy torch"
WHEEL_PLATFORMS="manylinux_2_28_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64
  manylinux_2_12_x86_64 manylinux2010_x86_64"
BCC_DEBS="libbpfcc python3-bpfcc libllvm14 libclang-cpp14 libbpf1 libz3-4"
NFT_DEBS="nftables libnftables1 libnftnl11 libmnl0 libjansson4 libxtables12"   # libedit2, libgmp10: on the device

PY=$ROOT/.venv/bin/python; [ -x "$PY" ] || PY=python3
say() { echo "== $*"; }
die() { echo "device-bundle: $*" >&2; exit 1; }

need_debian12() {
  [ "$(id -u)" = 0 ] || die "run as root (apt-get download, dpkg -x, chroot)"
  . /etc/os-release; [ "${VERSION_CODENAME:-}" = bookworm ] || die "needs Debian 12 (bookworm), this is ${PRETTY_NAME:-?}"
}

apt_fetch() {     # apt_fetch DIR PKG...: the candidate .deb of each package into DIR (fresh)
  local dir=$1; shift
  rm -rf "$dir"; mkdir -p "$dir"
  [ -n "${NO_APT_UPDATE:-}" ] || [ -n "${APT_UPDATED:-}" ] || { apt-get update -qq; APT_UPDATED=1; }
  (cd "$dir" && chmod 777 . && apt-get download -qq "$@" 2>&1 | grep -v '^W: Download is performed unsandboxed' || true)
  for p in "$@"; do ls "$dir/${p}_"*.deb >/dev/null 2>&1 || die "apt-get download $p failed"; done
}

# ------------------------------------------------------------------------------------------ wheels
do_wheels() {
  say "wheels -> .whl/ (CPython 3.12, manylinux x86_64)"
  local stage=$WORK/whl; rm -rf "$stage"; mkdir -p "$stage" "$WHL"
  local plat=(); for p in $WHEEL_PLATFORMS; do plat+=(--platform "$p"); done
  # shellcheck disable=SC2086
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${plat[@]}" -d "$stage" $WHEELS 2>&1 | { grep -v "^WARNING: Location 'file:" || true; }
  # the tags CPython 3.12 on glibc x86_64 accepts; one wheel per pin; every dependency carried
  "$PY" - "$stage" "$ON_DEVICE" $WHEELS <<'PYEOF'
import sys, zipfile, email.parser
from pathlib import Path
from pip._vendor.packaging import tags
from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.utils import canonicalize_name, parse_wheel_filename
stage, on_device, pins = Path(sys.argv[1]), set(sys.argv[2].split()), sys.argv[3:]
plats = [f"manylinux_2_{m}_x86_64" for m in range(39, 4, -1)] + ["manylinux2014_x86_64", "manylinux2010_x86_64", "linux_x86_64"]
ok_tags = set(tags.cpython_tags((3, 12), abis=["cp312", "abi3", "none"], platforms=plats)) \
    | set(tags.compatible_tags((3, 12), "cp312", plats))
env = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux", "os_name": "posix",
       "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython",
       "platform_python_implementation": "CPython", "platform_release": "", "platform_version": "",
       "implementation_version": "3.12.3", "extra": ""}
have, bad = {}, []
for w in sorted(stage.glob("*.whl")):
    name, ver, _, wtags = parse_wheel_filename(w.name)
    if not wtags & ok_tags:
        bad.append(f"{w.name}: no tag CPython 3.12 x86_64 accepts")
    if name in have:
        bad.append(f"{name}: two wheels")
    with zipfile.ZipFile(w) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        have[name] = (ver, email.parser.Parser().parsestr(z.read(meta).decode()))
for pin in pins:
    r = Requirement(pin)
    n = canonicalize_name(r.name)
    if n not in have or not r.specifier.contains(have[n][0], prereleases=True):
        bad.append(f"{pin}: not downloaded")
for name, (ver, msg) in sorted(have.items()):
    for line in msg.get_all("Requires-Dist") or []:
        r = Requirement(line)
        if r.marker and not r.marker.evaluate(env):
            continue
        n = canonicalize_name(r.name)
        if n in on_device:
            continue
        if n not in have:
            bad.append(f"{name} {ver} needs {line}: not carried (add it to WHEELS)")
        elif not r.specifier.contains(have[n][0], prereleases=True):
            bad.append(f"{name} {ver} needs {line}: carried {have[n][0]}")
if bad:
    sys.exit("device-bundle: " + "\n  ".join(["wheels:"] + bad))
print(f"   {len(have)} wheels, each for CPython 3.12 x86_64; every Requires-Dist carried (or {', '.join(sorted(on_device))} on the device)")
PYEOF
  # the virtualenv the tests run in: same versions?
  if [ -x "$ROOT/.venv/bin/python" ]; then
    # shellcheck disable=SC2086
    "$ROOT/.venv/bin/python" - $WHEELS <<'PYEOF' || true
import sys
from importlib.metadata import version, PackageNotFoundError
for pin in sys.argv[1:]:
    name, want = pin.split("==")
    try:
        v = version(name)
    except PackageNotFoundError:
        continue
    if v != want:
        print(f"   note: .venv has {name} {v}, the device gets {want}")
PYEOF
  fi
  # .whl/ = exactly the pinned set (one version each)
  local f
  for f in "$WHL"/*; do
    [ -e "$f" ] || continue
    [ -e "$stage/${f##*/}" ] || { echo "   removed ${f##*/}"; rm -rf "$f"; }
  done
  for f in "$stage"/*.whl; do cmp -s "$f" "$WHL/${f##*/}" 2>/dev/null || cp "$f" "$WHL/"; done
}

# --------------------------------------------------------------------------------------------- bcc
z3_stub() {    # z3_stub LIBLLVM OUT: a libz3.so.4 defining each Z3_* symbol libLLVM imports, aborting if called
  local c=$WORK/z3-stub.c
  {
    echo '/* stand-in libz3.so.4 (scripts/device-bundle.sh): libLLVM-14 links Z3 for the static analyzer'
    echo '   only, which BCC never runs; every function aborts with a message if ever called */'
    echo '#include <stdio.h>'; echo '#include <stdlib.h>'
    echo 'static void z3_missing(const char *f) { fprintf(stderr, "libz3 stand-in: %s called\n", f); abort(); }'
    nm -D --undefined-only "$1" | awk '$2 ~ /^Z3_/ {print $2}' | sort -u \
      | while read -r s; do echo "void $s(void) { z3_missing(\"$s\"); }"; done
  } > "$c"
  [ "$(grep -c '^void Z3_' "$c")" -gt 50 ] || die "libLLVM imports few Z3 symbols?"
  gcc -O2 -shared -fPIC -Wl,-soname,libz3.so.4 -o "$2" "$c"
  strip --strip-unneeded "$2"
}

do_bcc() {
  need_debian12
  say "bcc -> .deb/bcc.tar.xz"
  local hamd hcommon
  [ -n "${NO_APT_UPDATE:-}" ] || [ -n "${APT_UPDATED:-}" ] || { apt-get update -qq; APT_UPDATED=1; }
  # the newest kernel headers Debian 12 has: linux-headers-amd64 -> linux-headers-X-amd64 -> X-common
  hamd=$(apt-cache depends linux-headers-amd64 | awk '/Depends: linux-headers-.*-amd64$/ {print $2; exit}')
  hcommon=$(apt-cache depends "$hamd" | awk '/Depends: linux-headers-.*-common$/ {print $2; exit}')
  [ -n "$hamd" ] && [ -n "$hcommon" ] || die "cannot resolve linux-headers-amd64"
  apt_fetch "$WORK/debs" $BCC_DEBS "$hamd" "$hcommon"
  local T=$WORK/bcc; rm -rf "$T"; mkdir -p "$T"; chmod 755 "$T"
  local f; for f in "$WORK"/debs/*.deb; do dpkg -x "$f" "$T"; done
  local H=$T/usr/src; local amd=$H/$hamd common=$H/$hcommon
  [ -d "$amd/include" ] && [ -d "$common/include" ] || die "no headers under $H"
  # trim what BCC never reads
  rm -rf "$T/usr/share" "$T/lib" "$T/etc"
  rm -f "$T/usr/lib/x86_64-linux-gnu/libLLVM-14.so"
  rm -f "$amd/scripts" "$amd/tools" "$common/scripts" "$common/tools" "$amd/Module.symvers"
  find "$amd/include/config" -type f -size 0 -delete
  find "$common/arch" -mindepth 1 -maxdepth 1 ! -name x86 -exec rm -rf {} +
  # the comments of every header: what the kernel's kheaders archive drops too (gen_kheaders.sh)
  find "$H" -type f -name '*.h' -print0 | xargs -0 -P"$(nproc)" -n64 \
    perl -pi -e 'BEGIN {undef $/;}; s/\/\*((?!SPDX).)*?\*\///smg;'
  mkdir -p "$T/usr/lib/bcc-compat"
  if [ "$BCC_Z3" = stub ]; then
    z3_stub "$T/usr/lib/x86_64-linux-gnu/libLLVM-14.so.1" "$T/usr/lib/bcc-compat/libz3.so.4"
    rm -f "$T/usr/lib/x86_64-linux-gnu/libz3.so.4"
  fi
  # every library's NEEDED: in the tree, or one the device has (glibc, libstdc++, libelf, libedit, ...)
  local miss
  miss=$(find "$T/usr/lib" -name 'lib*.so*' -type f -exec readelf -d {} + 2>/dev/null \
    | awk -F'[][]' '/NEEDED/ {print $2}' | sort -u | while read -r l; do
        [ -n "$(find "$T/usr/lib" -name "$l")" ] && continue
        case $l in libc.so.6|libm.so.6|ld-linux-x86-64.so.2|libstdc++.so.6|libgcc_s.so.1|libz.so.1|libelf.so.1|\
          libedit.so.2|libffi.so.8|libtinfo.so.6|libxml2.so.2) ;; *) echo "$l" ;; esac
      done)
  [ -z "$miss" ] || die "bcc tree: no $miss"
  {
    echo "Debian 12 packages in this tree (scripts/device-bundle.sh):"
    for f in "$WORK"/debs/*.deb; do dpkg-deb -f "$f" Package Version | paste -sd' '; done | sed 's/^/  /'
    echo "Trimmed: usr/share, dev links, headers' non-x86 arch/, scripts/ and tools/ links, Module.symvers,"
    echo "include/config stamps, header comments (as kheaders)."
    if [ "$BCC_Z3" = stub ]; then
      echo "libz3.so.4 here: a stand-in (each Z3_* function libLLVM-14 imports aborts if called; LLVM"
      echo "uses Z3 only for the static analyzer's solver, never run by BCC)."
    fi
    echo "h200_setup.sh links each lib*.so.N of this folder into /opt/bcc/compat only where ldconfig does"
    echo "not know that soname, at the end of LD_LIBRARY_PATH."
    echo "The device also needs (not carried): libc6 libstdc++6 libgcc-s1 zlib1g libelf1 libedit2 libffi8 libtinfo6 libxml2."
  } > "$T/usr/lib/bcc-compat/README"
  mkdir -p "$DEB"
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$EPOCH" -C "$T" -cf - usr \
    | xz -T1 --x86 --lzma2=preset=9e > "$DEB/bcc.tar.xz.tmp"
  mv "$DEB/bcc.tar.xz.tmp" "$DEB/bcc.tar.xz"
  echo "   $(du -sb "$T" | cut -f1) bytes unpacked; $hamd, $hcommon; libz3: $BCC_Z3"
}

# --------------------------------------------------------------------------------------------- nft
do_nft() {
  need_debian12
  say "nft -> .deb/nft/"
  apt_fetch "$WORK/nft" $NFT_DEBS
  rm -rf "$DEB/nft"; mkdir -p "$DEB/nft"; cp "$WORK"/nft/*.deb "$DEB/nft/"
}

# -------------------------------------------------------------------------------------------- size
do_size() {
  say "sizes (bytes)"
  (cd "$ROOT" && find .deb .whl -type f -printf '   %12s  %p\n' 2>/dev/null | sort -k2 || true)
  "$PY" - "$LIMIT" "$AIM" <<'PYEOF'
import os, subprocess, sys
limit, aim = int(sys.argv[1]), int(sys.argv[2])
def size(p):
    st = os.lstat(p)
    return st.st_size
def tree(p):
    if not os.path.isdir(p):
        return 0
    return sum(size(os.path.join(d, f)) for d, _, fs in os.walk(p) for f in fs)
out = subprocess.run(["git", "ls-files", "-z", "--cached"], capture_output=True, check=True).stdout
tracked = {f for f in out.decode().split("\0") if f and os.path.lexists(f)}
out = subprocess.run(["git", "ls-files", "-z", "--others", "--exclude-standard"], capture_output=True, check=True).stdout
untracked = {f for f in out.decode().split("\0") if f and os.path.lexists(f)} - tracked
t, u, w, d = (sum(size(f) for f in tracked), sum(size(f) for f in untracked), tree(".whl"), tree(".deb"))
total = t + u + w + d
M = 1024 * 1024
for k, v in (("tracked", t), ("untracked, not ignored", u), (".whl", w), (".deb", d)):
    print(f"   {k:24s} {v:>11,d}  {v / M:6.2f} MiB")
print(f"   {'travels in all':24s} {total:>11,d}  {total / M:6.2f} MiB (limit 64 MiB, aim < 56 MiB)")
extra = [e for e in (os.listdir(".deb") if os.path.isdir(".deb") else []) if e not in ("bcc.tar.xz", "nft")]
if extra:
    print(f"   warning: .deb/ also holds {', '.join(extra)}: it travels too; remove it")
if total >= limit:
    sys.exit("device-bundle: over the device's 64 MiB")
if total >= aim:
    print("   warning: over the 56 MiB aim")
PYEOF
}

# ------------------------------------------------------------------------------------------- check
do_check() {
  need_debian12
  say "check: the bundle in a Debian 12 chroot without BCC/LLVM/libz3/libbpf, CPython 3.12"
  local R=${CHROOT:-/tmp/bundle-chroot} py=${PY312:-/root/.pyenv/versions/3.12.1}
  [ -x "$py/bin/python3.12" ] || die "no CPython 3.12 at $py (PY312=...)"
  [ -f "$DEB/bcc.tar.xz" ] && ls "$WHL"/*.whl >/dev/null 2>&1 || die "build the bundle first"
  if [ ! -x "$R/usr/bin/dpkg" ]; then
    command -v debootstrap >/dev/null || apt-get install -y -qq debootstrap
    debootstrap --variant=minbase --include=libelf1,libedit2,libxml2,libffi8,libtinfo6,zlib1g,libssl3,libsqlite3-0,libbz2-1.0,liblzma5,libreadline8,libncursesw6,libuuid1,xz-utils,libgmp10,gcc \
      bookworm "$R" http://deb.debian.org/debian >/dev/null
  fi
  # what an earlier check's h200_setup.sh left there (the links, /opt/bcc, /opt/nft, /tmp/site)
  rm -rf "$R/opt/bcc" "$R/opt/nft" "$R/tmp/site" "$R/lib/modules" "$R/usr/lib/python3/dist-packages/bcc" \
    "$R/usr/lib/x86_64-linux-gnu/libbcc.so.0" "$R/usr/lib/x86_64-linux-gnu/libbcc_bpf.so.0"
  chroot "$R" ldconfig
  local have
  have=$(chroot "$R" sh -c 'ls /usr/lib/python3/dist-packages/bcc /opt/bcc /opt/nft 2>/dev/null; ldconfig -p | grep -E "libbcc|libLLVM|libz3|libbpf|libclang"' || true)
  [ -z "$have" ] || die "the chroot $R is not clean (rm -rf it): $have"
  # the repository as the device gets it: tracked + untracked-not-ignored files, .whl, .deb
  rm -rf "$R/work"; mkdir -p "$R/work"
  (cd "$ROOT" && git ls-files -z --cached --others --exclude-standard \
     | tar --null -T - --ignore-failed-read -cf - 2>/dev/null | tar -C "$R/work" -xf -)
  cp -a "$WHL" "$DEB" "$R/work/"
  mkdir -p "$R/opt/py312"
  cat > "$R/work/.bundle-check.sh" <<'EOF'
set -u
cd /work
ln -sfn /opt/py312/bin/python3.12 /usr/local/bin/python3
export LD_LIBRARY_PATH=/opt/py312/lib
. examples/workload/h200_setup.sh
set +e
fail=
echo "python3: $(python3 -V), bcc: $(python3 -c 'import bcc; print(bcc.__file__)')"
echo "/lib/modules/$(uname -r)/build -> $(readlink /lib/modules/$(uname -r)/build)"
ls -l /opt/bcc/compat 2>/dev/null | awk 'NR>1 {print "compat:", $9, $10, $11}'
echo "nft: $(command -v nft) $(nft --version)"
unshare -n sh -c 'nft add table inet bundlecheck && nft add chain inet bundlecheck in "{ type filter hook input priority 0; }" \
  && nft add rule inet bundlecheck in tcp dport 9 numgen random mod 100 "<" 10 drop && nft list chain inet bundlecheck in' \
  | grep -q "numgen random mod 100 < 10 drop" && echo "nft: the lab's drop rule loads (in a private network namespace)" \
  || { echo "nft: the drop rule failed"; fail="$fail nft"; }
python3 - <<'PY' || fail="$fail tracepoint/uprobe"
import ctypes, os, time
from bcc import BPF
b = BPF(text=r"""
#include <linux/sched.h>
#include <uapi/linux/ptrace.h>
BPF_ARRAY(n, u64, 2);
TRACEPOINT_PROBE(sched, sched_switch) {
    struct task_struct *t = (struct task_struct *)bpf_get_current_task();
    int k = 0; u64 *v = n.lookup(&k); if (v) __sync_fetch_and_add(v, 1 + 0 * t->pid);
    return 0;
}
int on_getpid(struct pt_regs *ctx) { int k = 1; u64 *v = n.lookup(&k); if (v) __sync_fetch_and_add(v, 1); return 0; }
""")
path = BPF.find_library("c") or "/lib/x86_64-linux-gnu/libc.so.6"
b.attach_uprobe(name=path, sym="getpid", fn_name=b"on_getpid")
c = ctypes.CDLL(path)
for _ in range(1000):
    c.getpid()
time.sleep(0.3)
sw, up = (b["n"][ctypes.c_int(i)].value for i in (0, 1))
print(f"sched:sched_switch fired {sw} times, uprobe {path}:getpid {up} times")
assert sw > 0 and up >= 1000, "probes did not fire"
PY
echo "-- triscope doctor (every eBPF probe of the agent compiled and attached)"
python3 -m triscope.cli doctor --json > /tmp/doctor.json || fail="$fail doctor"
python3 - <<'PY' || fail="$fail doctor-probes"
import json, re, sys
bad = 0
for r in json.load(open("/tmp/doctor.json")):
    if r["kind"] == "probe" or not r["ok"]:
        print(f"  {r['kind']:9s} {r['name']:22s} {'ok' if r['ok'] else 'off'}  {str(r['reason'])[:110]}")
    # off for this kernel or host (a tracepoint absent, no libcuda mapped) is fine; BCC failing is not
    bad += r["kind"] == "probe" and not r["ok"] and bool(re.search(r"compil|bcc|BCC|header|rror", str(r["reason"])))
print(f"  {sum(r['ok'] for r in json.load(open('/tmp/doctor.json')) if r['kind'] == 'probe')} probes attached")
sys.exit(1 if bad else 0)
PY
echo "-- the CUDA driver uprobes (agent/ebpf/cuda.bpf.c) on the stand-in libcuda (fakecuda.c)"
OUT=/tmp/cuda timeout 120 python3 -m examples.hostlab.cuda_probe_check --stand-in --out /tmp/cuda >/tmp/cuda.log 2>&1 \
  || fail="$fail cuda_probe_check"
grep "counted" /tmp/cuda.log
python3 - <<'PY' || fail="$fail cuda-uprobes"
import json, sys
r = json.load(open("/tmp/cuda/cuda_probe_check.json"))
for name, ph in r.get("phases", {}).items():
    print(f"  {name:12s} {ph.get('symbols')}")
sys.exit(f"  errors: {r['errors']}" if r.get("errors") or not r.get("phases") else 0)
PY
echo "-- triscope db upgrade / export-trace"
rm -f /tmp/c.db
python3 -m triscope.cli db upgrade --db sqlite:////tmp/c.db || fail="$fail db-upgrade"
python3 -m triscope.cli import-trace examples/traces/h200-phases.jsonl.gz --db sqlite:////tmp/c.db >/dev/null || fail="$fail import-trace"
python3 -m triscope.cli export-trace --db sqlite:////tmp/c.db --node h200 -o /tmp/x.jsonl.gz || fail="$fail export-trace"
python3 -c 'import sqlalchemy, alembic, pydantic, yaml, h2, h11, bcrypt, prometheus_client, pynvml, google.protobuf, opentelemetry.proto, apscheduler, psutil, markupsafe, mako; print("imports ok from", sqlalchemy.__file__.rsplit("/", 2)[0])' \
  || fail="$fail imports"
[ -z "$fail" ] && echo "== check passed" || { echo "== check FAILED:$fail"; exit 1; }
EOF
  # a private mount namespace: /proc, /sys, /dev and CPython 3.12 bound into the chroot, gone after
  unshare -m --propagation private bash -c '
    R=$1; py=$2
    mount --rbind /proc "$R/proc"; mount --rbind /sys "$R/sys"; mount --rbind /dev "$R/dev"
    mount --bind "$py" "$R/opt/py312"
    chroot "$R" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
      bash /work/.bundle-check.sh' _ "$R" "$py"
}

steps=("$@"); [ ${#steps[@]} -gt 0 ] || steps=(wheels bcc nft size)
mkdir -p "$WORK"
for s in "${steps[@]}"; do
  case $s in
    wheels) do_wheels ;; bcc) do_bcc ;; nft) do_nft ;; size) do_size ;; check) do_check ;;
    *) die "unknown step $s (wheels bcc nft size check)" ;;
  esac
done
