"""Training plots: every panel draws what its legend says (matplotlib figure inspected, no pixels)."""

import pytest

pytest.importorskip("matplotlib")


def _recs(dvd: bool, off: bool):
    base = {"loss": 2.0, "ce_loss": 2.0, "tau_estimate": 1.2, "accept_rate@slot": [0.5, 0.3, 0.1],
            "top1_acc@slot": [0.6, 0.4, 0.2]}
    if dvd:
        base.update({"draft1/tau": 1.1, "draft1/rejected_hist": [1, 2, 3, 4]})
    if off:
        base.update({"off/ce_loss": 2.1, "off/tau_estimate": 1.15, "off/top1_acc@slot": [0.55, 0.35, 0.15]})
    return [{"step": s, **base} for s in (1, 2)]


def test_dvd_run_draws_the_withheld_overlay_on_the_metric_logged_both_ways():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from carryover_jax.train.plots import metrics_figure

    fig = metrics_figure(_recs(dvd=True, off=True))
    ax = fig.axes[2]
    assert ax.get_legend_handles_labels()[1] == ["carried rows withheld", "carried rows supplied"]
    assert [p.get_height() for p in ax.patches] == [0.6, 0.4, 0.2]  # top1_acc@slot, the supplied side
    assert list(ax.lines[0].get_ydata()) == [0.55, 0.35, 0.15]
    assert ax.get_title().startswith("top1_acc@slot")
    plt.close(fig)

    fig = metrics_figure(_recs(dvd=False, off=False))  # a baseline run: the accept rate, no overlay
    ax = fig.axes[2]
    assert ax.get_title().startswith("accept_rate@slot") and not ax.lines
    assert [p.get_height() for p in ax.patches] == [0.5, 0.3, 0.1]
    plt.close(fig)
