"""`--plot FILE.png`: decode tok/s against batch size, ours (a line per sampling setting)
beside transformers' (greedy).

matplotlib is an optional extra (`pip install tinychat[plot]`), never a dependency.
"""

from __future__ import annotations


def plot_decode(results: dict, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("--plot needs matplotlib (pip install 'tinychat[plot]'); no plot written")
        return
    rows = results.get("decode", [])
    if not rows:
        print("--plot needs the decode workload; no plot written")
        return
    batches = sorted({r["batch_size"] for r in rows})
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for sampling in dict.fromkeys(r.get("sampling", "greedy") for r in rows):
        mine = [r for r in rows if r.get("sampling", "greedy") == sampling]
        ax.plot(
            [r["batch_size"] for r in mine],
            [r["decode_tok_s"] for r in mine],
            "o-",
            label=f"tinychat ({sampling})",
        )
    for mode in ("eager", "static"):
        points = [(b, results.get("hf", {}).get(mode, {}).get(f"batch_{b}")) for b in batches]
        points = [(b, v) for b, v in points if v]
        if points:
            ax.plot(*zip(*points, strict=True), "s--", label=f"transformers ({mode})")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch size")
    ax.set_ylabel("decode tokens / s")
    ax.set_title(f"{results['model']} on {results['device_name']}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot written to {path}")
