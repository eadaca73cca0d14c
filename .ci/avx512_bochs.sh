#!/usr/bin/env bash
# The release binary's smoke path (.ci/smoke.sh) on an emulated AVX-512 CPU: no
# AVX-512 on the CI machine, and QEMU's TCG has none, but Bochs emulates it (EVEX).
# Boots a tiny Linux guest in Bochs (CPU model with avx512f, no display, serial
# console into a file): Debian's kernel from its .deb and an initramfs holding the
# binary, the libraries `ldd` lists, bash, busybox and .ci/smoke.sh, whose /init runs
# `.ci/smoke.sh run` and prints the figures between markers on the serial console,
# then powers off. The guest's figures must name gemm's AVX-512 kernels
# (`isa AVX-512F_(512-bit_FMA)`) and equal the native run's (`.ci/smoke.sh compare`).
#
#   .ci/avx512_bochs.sh [BINARY [OUT_DIR [NATIVE_FIGURES]]]
#       BINARY          default ${CARGO_TARGET_DIR:-target}/release/tinylm (cargo build --release -p tinylm-cli)
#       OUT_DIR         default ${CARGO_TARGET_DIR:-target}/smoke/avx512-bochs
#       NATIVE_FIGURES  figures.txt of a native smoke run of BINARY, if one exists
#                       (.ci/run has one); otherwise the native run is made here
#   Environment: BOCHS_CPU (default corei7_skylake_x), BOCHS_TIMEOUT (seconds, default 1800),
#                BOCHS_ISA (expected isa line, default 'isa AVX-512F_(512-bit_FMA)'),
#                BOCHS_BREAK=0 skips the breakpoint proof (below; it needs the binary's symbols).
#   A control run on a CPU without AVX-512 (none of the breakpoints may be hit there):
#     BOCHS_CPU=corei7_haswell_4770 BOCHS_ISA='isa AVX2+FMA_(256-bit_FMA)' .ci/avx512_bochs.sh
# Besides the isa line (is_x86_feature_detected!("avx512f"), gemm's own dispatch test),
# Bochs' debugger proves that gemm's AVX-512 code ran: a breakpoint on every
# gemm_common::simd::x86::V4::vectorize function (the entry of gemm's AVX-512 path;
# its code uses zmm registers) must be hit in the guest.
# Installs what it needs with apt-get (Debian bookworm; sudo when not root); bochs-term
# only stands for the GUI plugin the bochs package wants (the run uses rfb, headless).
set -euo pipefail
cd "$(dirname "$0")/.."

target_dir="${CARGO_TARGET_DIR:-target}"
tinylm="${1:-$target_dir/release/tinylm}"
out="${2:-$target_dir/smoke/avx512-bochs}"
native_figures="${3:-}"
cpu_model="${BOCHS_CPU:-corei7_skylake_x}"
timeout_s="${BOCHS_TIMEOUT:-1800}"
want_isa="${BOCHS_ISA:-isa AVX-512F_(512-bit_FMA)}"

fail() {
    echo "avx512_bochs: $*" >&2
    if [ -s "${serial:-}" ]; then
        echo "---- serial console (last 60 lines, $serial)" >&2
        tr -d '\r' < "$serial" | tail -n 60 >&2
    fi
    if [ -s "${bochs_log:-}" ]; then
        echo "---- Bochs log (last 20 lines, $bochs_log)" >&2
        tail -n 20 "$bochs_log" >&2
    fi
    exit 1
}

[ -x "$tinylm" ] || fail "no binary at $tinylm (cargo build --release -p tinylm-cli)"

sudo=""
[ "$(id -u)" = 0 ] || sudo=sudo
if ! command -v bochs >/dev/null || ! [ -x /bin/busybox ] || ! command -v grub-mkrescue >/dev/null \
    || ! [ -d /usr/lib/grub/i386-pc ] || ! command -v xorriso >/dev/null \
    || ! command -v mformat >/dev/null || ! command -v cpio >/dev/null || ! command -v nm >/dev/null \
    || ! [ -f /usr/share/bochs/BIOS-bochs-latest ] || ! [ -f /usr/share/vgabios/vgabios.bin ]; then
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
        bochs bochs-term bochsbios vgabios busybox-static grub-pc-bin grub-common xorriso mtools cpio binutils >/dev/null
fi

rm -rf "$out"
mkdir -p "$out"
out=$(cd "$out" && pwd)
serial="$out/serial.log"
bochs_log="$out/bochs.log"

# ---- the kernel: Debian's, from the package linux-image-amd64 depends on (kept between runs)
kernel_dir="$target_dir/bochs-kernel"
if ! ls "$kernel_dir"/boot/vmlinuz-* >/dev/null 2>&1; then
    pkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-/ { print $2; exit }')
    [ -n "$pkg" ] || fail "apt-cache knows no linux-image-amd64 (apt-get update?)"
    rm -rf "$kernel_dir"
    mkdir -p "$kernel_dir"
    (cd "$kernel_dir" && chmod 777 . && apt-get download -qq "$pkg" 2>/dev/null && dpkg-deb -x ./*.deb . \
        && find . -mindepth 1 -maxdepth 1 ! -name boot -exec rm -rf {} +) \
        || fail "could not download and extract $pkg"
fi
vmlinuz=$(ls "$kernel_dir"/boot/vmlinuz-*)

# ---- the initramfs: binary + its libraries, bash + its libraries, busybox, smoke.sh, /init
root="$out/initramfs"
mkdir -p "$root"/{bin,dev,proc,sys,tmp}
cp /bin/busybox "$root/bin/busybox"
cp -L /bin/bash "$root/bin/bash"
cp -L "$tinylm" "$root/tinylm"
cp .ci/smoke.sh "$root/smoke.sh"
for lib in $( (ldd /bin/bash; ldd "$tinylm") | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' | sort -u); do
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
done
cat > "$root/init" <<'EOF'
#!/bin/busybox sh
/bin/busybox mount -t proc proc /proc
/bin/busybox --install -s /bin
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
echo 1 > /proc/sys/kernel/printk
export PATH=/bin HOME=/tmp
echo "==== tinylm-bochs guest up at $(cut -d' ' -f1 /proc/uptime) s"
echo "cpuinfo avx512f: $(grep -o avx512f /proc/cpuinfo | head -1)"
echo "cpu flags: $(grep -m1 '^flags' /proc/cpuinfo | grep -oE '(avx|xsave|fma)[0-9a-z_]*' | tr '\n' ' ')"
dmesg | grep -E 'x86/fpu|XSAVE'
status=0
/bin/bash /smoke.sh run /tmp/out -- /tinylm 2> /tmp/smoke.stderr || status=$?
echo "==== tinylm-bochs smoke done at $(cut -d' ' -f1 /proc/uptime) s, status $status"
echo "==== BEGIN figures.txt"
cat /tmp/out/figures.txt 2>/dev/null
echo "==== END figures.txt"
if [ "$status" != 0 ]; then
    echo "==== BEGIN logs"
    cat /tmp/smoke.stderr /tmp/out/*.log 2>/dev/null
    echo "==== END logs"
fi
echo "==== tinylm-bochs exit $status"
sleep 2 # the serial port drains
poweroff -f
echo o > /proc/sysrq-trigger
EOF
chmod +x "$root/init"
(cd "$root" && find . | LC_ALL=C sort | cpio -o -H newc --quiet) > "$out/initrd.cpio"

# ---- the boot CD: GRUB (BIOS), the kernel and the initramfs
# clearcpuid=xsaves,xsavec: Bochs 2.7 reports the standard XSAVE area size for the
# compacted format too (CPUID 0xD.1 EBX 2688, not 2432), so Linux would find an
# "XSAVE consistency problem" and turn XSAVE off, and with it AVX and AVX-512; without
# XSAVES/XSAVEC it uses the standard format, whose size Bochs reports right.
# norandmaps: the binary at its fixed PIE base (0x555555554000), for the breakpoints.
iso_dir="$out/iso"
mkdir -p "$iso_dir/boot/grub"
cp "$vmlinuz" "$iso_dir/boot/vmlinuz"
mv "$out/initrd.cpio" "$iso_dir/boot/initrd.cpio"
cat > "$iso_dir/boot/grub/grub.cfg" <<'EOF'
set timeout=0
set default=0
menuentry tinylm {
    linux /boot/vmlinuz console=ttyS0,115200 quiet loglevel=3 rdinit=/init panic=-1 mitigations=off clearcpuid=xsaves,xsavec norandmaps
    initrd /boot/initrd.cpio
}
EOF
grub-mkrescue -o "$out/boot.iso" "$iso_dir" >"$out/grub-mkrescue.log" 2>&1 \
    || { cat "$out/grub-mkrescue.log" >&2; fail "grub-mkrescue failed"; }

# ---- Bochs: no display, serial console into a file, the CD as the boot device
cat > "$out/bochsrc" <<EOF
megs: 512
cpu: model=$cpu_model, count=1, ips=100000000, reset_on_triple_fault=0
romimage: file=/usr/share/bochs/BIOS-bochs-latest
vgaromimage: file=/usr/share/vgabios/vgabios.bin
ata0-master: type=cdrom, path=$out/boot.iso, status=inserted
boot: cdrom
display_library: rfb, options="timeout=0"
clock: sync=none, time0=local
com1: enabled=1, mode=file, dev=$serial
log: $bochs_log
panic: action=fatal
error: action=report
info: action=report
debug: action=ignore
speaker: enabled=0
EOF
# Debian's Bochs has its debugger built in, which reads commands first: the
# breakpoints, continue (to the first hit), delete them, continue (to the power-off).
break_syms=()
if [ "${BOCHS_BREAK:-1}" = 1 ]; then
    base=0
    [ "$(readelf -h "$tinylm" | awk '$1 == "Type:" { print $2 }')" != DYN ] || base=$((0x555555554000))
    mapfile -t break_syms < <(nm -C "$tinylm" \
        | awk '$2 ~ /^[tT]$/ && $3 ~ /^gemm_common::simd::x86::V4::vectorize::/ { print $1, $3 }' | head -n 16)
    [ "${#break_syms[@]}" -gt 0 ] || fail "no gemm_common::simd::x86::V4::vectorize symbols in $tinylm \
(stripped? BOCHS_BREAK=0 skips the breakpoint proof)"
fi
{
    for sym in "${break_syms[@]}"; do
        printf 'lb 0x%x\n' $((base + 0x${sym%% *}))
    done
    echo continue
    for i in "${!break_syms[@]}"; do
        echo "d $((i + 1))"
    done
    echo continue
    echo quit
} > "$out/bochs.rc"
echo "avx512_bochs: booting the guest in Bochs (cpu model $cpu_model, at most ${timeout_s}s)"
start=$(date +%s)
: > "$serial"
bochs -q -f "$out/bochsrc" -rc "$out/bochs.rc" </dev/null >"$out/bochs.stdout" 2>&1 &
bochs_pid=$!
done_line=""
up_s=""
while kill -0 "$bochs_pid" 2>/dev/null; do
    if [ -z "$up_s" ] && grep -q '^==== tinylm-bochs guest up' "$serial"; then
        up_s=$(($(date +%s) - start))
        echo "avx512_bochs: the guest's /init started after ${up_s}s"
    fi
    done_line=$(tr -d '\r' < "$serial" | grep -m1 '^==== tinylm-bochs exit' || true)
    [ -z "$done_line" ] || break
    if [ $(($(date +%s) - start)) -ge "$timeout_s" ]; then
        kill "$bochs_pid" 2>/dev/null || true
        wait "$bochs_pid" 2>/dev/null || true
        fail "the guest did not finish in ${timeout_s}s"
    fi
    sleep 2
done
# The guest powers off (Bochs stops); give it a moment, then stop Bochs ourselves.
for _ in 1 2 3 4 5; do
    kill -0 "$bochs_pid" 2>/dev/null || break
    sleep 1
done
kill "$bochs_pid" 2>/dev/null || true
wait "$bochs_pid" 2>/dev/null || true
done_line=$(tr -d '\r' < "$serial" | grep -m1 '^==== tinylm-bochs exit' || true)
[ -n "$done_line" ] || fail "Bochs stopped before the guest finished"
echo "avx512_bochs: guest finished in $(($(date +%s) - start))s wall"
tr -d '\r' < "$serial" | grep -E '^(==== tinylm-bochs|cpuinfo|cpu flags)' || true

# ---- the guest's figures, its ISA, and the same smoke natively
mkdir -p "$out/guest"
tr -d '\r' < "$serial" | sed -n '/^==== BEGIN figures.txt$/,/^==== END figures.txt$/p' \
    | sed '1d;$d' > "$out/guest/figures.txt"
[ "$done_line" = "==== tinylm-bochs exit 0" ] || fail "the smoke path failed in the guest ($done_line)"
case $want_isa in
    *AVX-512*) grep -qx 'cpuinfo avx512f: avx512f' <(tr -d '\r' < "$serial") \
        || fail "the guest's /proc/cpuinfo has no avx512f" ;;
esac
[ -s "$out/guest/figures.txt" ] || fail "no figures in the serial log"
hit=$(grep -m1 -o 'Breakpoint [0-9]*, 0x[0-9a-f]*' "$out/bochs.stdout" || true)
if [ "${#break_syms[@]}" -gt 0 ] && [[ $want_isa != *AVX-512* ]]; then
    [ -z "$hit" ] || fail "$hit: gemm's AVX-512 code ran on a CPU model without AVX-512?"
    echo "guest ran no AVX-512 gemm code (none of the ${#break_syms[@]} breakpoints hit)"
elif [ "${#break_syms[@]}" -gt 0 ]; then
    [ -n "$hit" ] || fail "no breakpoint on gemm's AVX-512 code (gemm_common::simd::x86::V4::vectorize) was hit"
    n=${hit#Breakpoint }
    n=${n%%,*}
    # Bochs' time (ticks, about the instructions emulated) at the hit
    ticks=$(awk '/Breakpoint [0-9]*, 0x/ { b = 1 } b && /^Next at t=/ { sub(/^Next at t=/, ""); print; exit }' \
        "$out/bochs.stdout")
    echo "guest ran gemm's AVX-512 code: Bochs breakpoint $n hit at ${hit##* } \
(${break_syms[$((n - 1))]#* }, offset 0x${break_syms[$((n - 1))]%% *}), Bochs time t=$ticks"
fi
isa=$(head -1 "$out/guest/figures.txt")
echo "guest (bochs $cpu_model): $isa"
[ "$isa" = "$want_isa" ] || fail "the guest's ISA is '$isa', not '$want_isa'"
if [ -z "$native_figures" ]; then
    .ci/smoke.sh run "$out/native" -- "$tinylm" 2> "$out/native.stderr" \
        || { cat "$out/native.stderr" >&2; fail "the native smoke path failed"; }
    native_figures="$out/native/figures.txt"
fi
echo "native: $(head -1 "$native_figures")"
.ci/smoke.sh compare 1e-4 "$native_figures" "$out/guest/figures.txt" \
    || fail "the guest's figures differ from the native ones"
