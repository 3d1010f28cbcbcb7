"""PNG plots of a report: images/s per epoch per target (the local-disk target, when there is
one, as a dashed reference line over each epoch's bars), the per-file latency CDF, and backend
requests per image by kind. Needs matplotlib (the ``loadgen`` extra); without it the report
is still written and ``write_plots`` says why there are no pictures.

Must not: compute figures (they come from ``report``).
"""

from __future__ import annotations

from pathlib import Path

from loadgen.report import KINDS, RunReport, local_reference

__all__ = ["write_plots"]


def write_plots(run: RunReport, out_dir: str | Path) -> list[Path]:
    """Write the three PNGs into ``out_dir``; returns their paths (empty without
    matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    targets = [t for t in run.targets if t.epochs]
    if not targets:
        return []
    paths: list[Path] = []
    n_epochs = max(len(t.epochs) for t in targets)
    local = local_reference(run)
    barred = [t for t in targets if t is not local] or targets
    width = 0.8 / len(barred)

    # 1. images/s per epoch per target, local disk as the reference line
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, t in enumerate(barred):
        xs = [e.epoch + (i - (len(barred) - 1) / 2) * width for e in t.epochs]
        bars = ax.bar(xs, [e.images_per_s for e in t.epochs], width, label=t.name)
        ax.bar_label(bars, fmt="%.0f", fontsize=7)
    if local is not None and local is not barred[0]:
        for j, e in enumerate(local.epochs):
            ax.hlines(
                e.images_per_s,
                e.epoch - 0.45,
                e.epoch + 0.45,
                colors="black",
                linestyles="dashed",
                label=("local disk" if local.name == "local" else f"{local.name} (local disk)")
                if j == 0
                else "_nolegend_",
            )
            ax.annotate(
                f"{e.images_per_s:.0f}",
                (e.epoch + 0.45, e.images_per_s),
                ha="right",
                va="bottom",
                fontsize=7,
            )
    ax.set_xticks(range(1, n_epochs + 1))
    ax.set_xlabel("epoch (1 = cold)")
    ax.set_ylabel("images/s")
    ax.set_title("Throughput per epoch")
    ax.legend(fontsize=8)
    fig.tight_layout()
    p = out / "images_per_s.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(p)

    # 2. per-file latency CDF
    fig, ax = plt.subplots(figsize=(7, 4))
    styles = ["-", "--", ":", "-."]
    for i, t in enumerate(targets):
        color = f"C{i % 10}"  # one colour per target, one line style per epoch
        for e in t.epochs:
            if not e.cdf_ms:
                continue
            xs = [max(x, 1e-3) for x, _ in e.cdf_ms]
            ys = [y for _, y in e.cdf_ms]
            style = styles[(e.epoch - 1) % len(styles)]
            ax.plot(xs, ys, color=color, linestyle=style, label=f"{t.name} e{e.epoch}")
    ax.set_xscale("log")
    ax.set_xlabel("per-file latency (ms, log)")
    ax.set_ylabel("fraction of files")
    ax.set_ylim(0, 1.0)
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title("Per-file latency CDF")
    ax.legend(fontsize=7)
    fig.tight_layout()
    p = out / "latency_cdf.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(p)

    # 3. backend requests per image, stacked by kind
    labels: list[str] = []
    stacks: dict[str, list[float]] = {k: [] for k in KINDS}
    for t in targets:
        for e in t.epochs:
            labels.append(f"{t.name}\ne{e.epoch}")
            r = e.requests_per_image or {}
            for k in KINDS:
                stacks[k].append(r.get(k, 0.0))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.8 * len(labels) + 2), 4))
    bottom = [0.0] * len(labels)
    for k in KINDS:
        ax.bar(range(len(labels)), stacks[k], 0.6, bottom=bottom, label=k)
        bottom = [b + v for b, v in zip(bottom, stacks[k], strict=True)]
    for i, total in enumerate(bottom):
        ax.annotate(f"{total:.2f}", (i, total), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(labels)), labels, fontsize=7)
    ax.set_ylabel("backend requests per image")
    ax.set_title("Backend requests per image (epoch 1 includes the tree scan)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    p = out / "requests_per_image.png"
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(p)
    return paths
