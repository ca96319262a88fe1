#!/bin/sh
# What this container can reach of the GPU, one fact a line; the last line is the verdict.
# The environment is read from the first process's own (/proc/1/environ: every entry the
# runtime gave, duplicates and their order included), not from this shell's.
env_entries=$(tr '\0' '\n' </proc/1/environ | grep '^NVIDIA_VISIBLE_DEVICES=' | tr '\n' ' ')
echo "env: ${env_entries:-(none)}"
echo "dev: $(ls /dev | grep -i nvidia | tr '\n' ' ')"
for d in /dev/nvidiactl /dev/nvidia0; do
    [ -e "$d" ] || continue
    if (exec 3<"$d") 2>/tmp/open.err; then echo "open $d: ok"; else echo "open $d: $(cat /tmp/open.err)"; fi
done
smi=""
for s in nvidia-smi /usr/bin/nvidia-smi /usr/local/nvidia/bin/nvidia-smi /usr/local/bin/nvidia-smi; do
    if command -v "$s" >/dev/null 2>&1; then smi=$(command -v "$s"); break; fi
done
if [ -n "$smi" ]; then
    out=$("$smi" -L 2>&1)
    echo "nvidia-smi -L: $out"
else
    out=""
    echo "nvidia-smi -L: (no nvidia-smi in the container)"
fi
case "$out" in
    *"GPU "*UUID*) echo "verdict: GPU SEEN" ;;
    *) echo "verdict: NO GPU" ;;
esac
[ -n "$HOLD" ] && exec sleep "$HOLD"
exit 0
