#!/bin/sh
# Provision kernel headers for BCC, then exec the agent.  Never fails the pod: without headers the
# eBPF collectors report "unavailable" with the reason and the agent runs on procfs/sysfs/NVML.
set -eu
kver=$(uname -r)
host_modules=${TRISCOPE_HOST_MODULES:-/host/lib/modules}
host_src=${TRISCOPE_HOST_USR_SRC:-/host/usr/src}
mods=${TRISCOPE_MODULES_DIR:-/lib/modules}/$kver   # /lib/modules is a small writable emptyDir in the pod

# map a host path (/usr/src/...) to where the host's /usr/src is mounted in the container
to_container() {
    case "$1" in
        /usr/src/*) echo "$host_src/${1#/usr/src/}" ;;
        /lib/modules/*) echo "$host_modules/${1#/lib/modules/}" ;;
        *) echo "$1" ;;
    esac
}

mkdir -p "$mods" 2>/dev/null || true
if [ -w "$mods" ] && [ ! -e "$mods/build/include" ]; then
    origin=""
    for kind in build source; do
        target=""
        if [ -L "$host_modules/$kver/$kind" ]; then
            target=$(to_container "$(readlink "$host_modules/$kver/$kind")")
        elif [ -d "$host_src/linux-headers-$kver" ]; then
            target="$host_src/linux-headers-$kver"
        fi
        if [ -n "$target" ] && [ -d "$target" ]; then
            ln -sfn "$target" "$mods/$kind"; origin="node"
        fi
    done
    if [ -z "$origin" ] && [ ! -r "${TRISCOPE_KHEADERS:-/sys/kernel/kheaders.tar.xz}" ]; then
        # generic Debian headers shipped in the image (tracepoint programs only)
        build=$(ls -d ${TRISCOPE_IMAGE_USR_SRC:-/usr/src}/linux-headers-*-amd64 2>/dev/null | sort -V | tail -n1 || true)
        common=$(ls -d ${TRISCOPE_IMAGE_USR_SRC:-/usr/src}/linux-headers-*-common 2>/dev/null | sort -V | tail -n1 || true)
        if [ -n "$build" ]; then
            ln -sfn "$build" "$mods/build"
            [ -n "$common" ] && ln -sfn "$common" "$mods/source"
            origin="image ($(basename "$build"))"
        fi
    fi
    echo "triscope-agent: kernel $kver, BCC headers from: ${origin:-kheaders or none}" >&2
fi
exec "$@"
