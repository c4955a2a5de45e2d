"""PCIe link arithmetic shared by the collectors (sysfs, NVML) and the analysis."""

from __future__ import annotations


def encoding_efficiency(speed_gts: float) -> float:
    """Share of the raw bit rate that carries data after line encoding, by PCIe generation."""

    if speed_gts <= 5.0:
        return 8 / 10  # Gen1, Gen2: 8b/10b
    if speed_gts <= 32.0:
        return 128 / 130  # Gen3, Gen4, Gen5: 128b/130b
    return 242 / 256  # Gen6+: PAM4, 256-byte FLITs carrying 236 B TLP + 6 B DLP (+ CRC/FEC)


def link_capacity_bytes_per_second(speed_gts: float, width: float) -> float:
    """One-way payload capacity of a PCIe link from its per-lane rate (GT/s) and width (lanes).

    Gen 1/2 (2.5/5 GT/s) use 8b/10b encoding, gen 3-5 128b/130b, gen 6+ FLIT mode (242/256).
    Gen5 x16: 32 GT/s x 16 x 128/130 / 8 = 63.0 GB/s.  0 for an unknown speed or width (<= 0).
    """
    if speed_gts <= 0 or width <= 0:
        return 0.0
    return speed_gts * 1e9 * width * encoding_efficiency(speed_gts) / 8.0
