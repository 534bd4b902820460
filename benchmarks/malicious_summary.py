"""The malicious-server table (results/malicious/summary.csv) from the committed runs.

For every run directory under results/malicious (one config of benchmarks/malicious each) and
every (attack, defense) cell: the examples behind one update (batch size times clients), the
share of images recovered exactly (MSE <= 1e-3) with its binomial 95% interval (Clopper-Pearson,
scipy), the share the attack's closed form predicts for an undefended update
(`leakbench.attacks.imprint.singleton_share`, `leakbench.attacks.trap_weights.recovery_chance`),
the share at PSNR >= 60 dB, the median PSNR, and the client's side: the trials, the share of
them whose D-SNR check flags the model and the median D-SNR (detection.csv).

    PYTHONSAFEPATH=1 python benchmarks/malicious_summary.py

For `dpsgd` cells, ``bound`` is what the privacy accounting allows any attacker: the largest
chance of reconstructing a given example from one update
(`leakbench.defenses.dpsgd.DPSGD.reconstruction_bound`) for a prior success of ``KAPPA``. The
prior is an attacker who never saw the update guessing within MSE 1e-3 of the example;
results/malicious/prior.csv measures how often a public image is that close to a private one,
the guess such an attacker could make.

It also draws results/malicious/figures/noise.{pdf,png}: the share recovered exactly against
the noise of `gaussian` (sigma) and `dpsgd` (noise multiplier) at a batch of 64, with the
accounting's bound in the DP-SGD panel.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from leakbench.attacks.imprint import singleton_share
from leakbench.attacks.trap_weights import recovery_chance
from leakbench.core.environment import script_command, write_run_record
from leakbench.datasets import load_dataset
from leakbench.defenses import make_defense
from leakbench.run.config import load_record
from leakbench.run.plan import plan, private_split, public_split

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_outputs import write_rows  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results" / "malicious"
EXACT_MSE = 1e-3
COLUMNS = [
    "run", "dataset", "model", "attack", "attack_params", "defense", "defense_params",
    "clients", "batch_size", "examples", "images", "recovered", "recovered_low",
    "recovered_high", "predicted", "bound", "psnr60", "psnr_median", "trials", "flagged",
    "dsnr_median",
]  # fmt: skip
# The prior of the accounting's bound: the chance that an attacker who never saw the update
# outputs an image within MSE 1e-3 of a given private one. Generous next to prior.csv.
KAPPA = 1e-3
PRIOR_COLUMNS = [
    "run", "dataset", "private", "public", "pairs", "near", "share", "share_high", "norm_median",
]  # fmt: skip


def predicted_share(attack: str, params: dict, examples: int) -> float:
    """What the attack's closed form predicts for an undefended update of ``examples``."""
    if attack == "imprint":
        return singleton_share(int(params["bins"]), examples)
    if attack == "trap_weights":
        return recovery_chance(int(params["units"]), float(params["rate"]), examples)
    return float("nan")


def accounting_bound(defense: str, params: dict, clients: int) -> float:
    """The accounting's bound on any attacker's chance to reconstruct an example (DP-SGD only)."""
    if defense != "dpsgd":
        return float("nan")
    return make_defense(defense, **params).reconstruction_bound(KAPPA, clients=clients)


def near_duplicates(run: Path) -> list:
    """How many (private, public) image pairs of ``run`` lie within MSE 1e-3 of each other: the
    rate at which a guess from the public split would count as an exact reconstruction; and the
    private images' median L2 norm."""
    spec = load_record(run / "config.toml")
    dataset = load_dataset(spec.dataset, spec.image_size)
    indices = sorted({i for trial in plan(spec, dataset) for i in trial.indices})
    threat = spec.threat_model
    private = private_split(threat, dataset).x[indices].reshape(len(indices), -1).astype(np.float64)
    public = public_split(threat, dataset).x.reshape(len(public_split(threat, dataset)), -1)
    public = public.astype(np.float64)
    squared = (private**2).sum(1)[:, None] + (public**2).sum(1)[None, :] - 2.0 * private @ public.T
    near = int((squared / private.shape[1] <= EXACT_MSE).sum())
    pairs = private.shape[0] * public.shape[0]
    high = stats.binomtest(near, pairs).proportion_ci(0.95).high
    norm = float(np.median(np.linalg.norm(private, axis=1)))  # for the noise floor of a reading
    counts = [len(private), len(public), pairs, near, near / pairs, high]
    return [run.name, spec.dataset, *counts, norm]


def summarise(run: Path) -> list[list]:
    trials = pd.read_csv(run / "trials.csv")
    detection_path = run / "detection.csv"
    detection = pd.read_csv(detection_path) if detection_path.is_file() else None
    clients = int(_threat(run).get("clients", 1))
    rows = []
    cells = ["attack", "attack_params", "defense", "defense_params"]
    for (attack, attack_params, defense, defense_params), cell in trials.groupby(cells, sort=False):
        batch = int(cell["batch_size"].iloc[0])  # the examples behind one update
        n, k = len(cell), int((cell["mse"] <= EXACT_MSE).sum())
        interval = stats.binomtest(k, n).proportion_ci(0.95)
        flagged = dsnr = float("nan")
        trials = len(cell.drop_duplicates(["seed", "batch_index"]))
        if detection is not None:
            key = [attack, attack_params, defense, defense_params]
            mine = detection[(detection[cells] == key).all(axis=1)]
            if mine["dsnr"].notna().any():  # clients of one example have nothing to check
                flagged = float(mine["flagged"].mean())
                dsnr = float(np.nanmedian(mine["dsnr"]))
        rows.append([
            run.name, cell["dataset"].iloc[0], cell["model"].iloc[0], attack, attack_params,
            defense, defense_params, clients, batch // clients, batch, n, k / n, interval.low,
            interval.high, predicted_share(attack, json.loads(attack_params), batch),
            accounting_bound(defense, json.loads(defense_params), clients),
            float((cell["psnr"] >= 60).mean()), float(cell["psnr"].median()), trials, flagged,
            dsnr,
        ])  # fmt: skip
    return rows


def _threat(run: Path) -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    return tomllib.loads((run / "config.toml").read_text(encoding="utf-8")).get("threat_model", {})


NOISE_RUNS = {"digits-b64": "digits, lenet", "cifar10-convnet-b64": "CIFAR-10, convnet",
              "cifar10-lenet-b64": "CIFAR-10, lenet"}  # fmt: skip
NOISE = {"gaussian": "sigma", "dpsgd": "noise_multiplier"}


def noise_figure(frame: pd.DataFrame, folder: Path) -> list[Path]:
    """The share recovered exactly against each noise defense's strength, a line per run and
    attack, with the 95% intervals; the undefended share at the left edge as a marker."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.0, 2.8))
    axes = fig.subplots(1, len(NOISE), squeeze=False)[0]
    for ax, (defense, parameter) in zip(axes, NOISE.items(), strict=True):
        for run, label in NOISE_RUNS.items():
            for attack, style in (("imprint", "-o"), ("trap_weights", "--s")):
                rows = frame[(frame.run == run) & (frame.attack == attack)
                             & (frame.defense == defense)]  # fmt: skip
                if rows.empty:
                    continue
                x = pd.Series([json.loads(text)[parameter] for text in rows.defense_params])
                order = np.argsort(x.values)
                share = rows.recovered.values[order]
                low, high = rows.recovered_low.values[order], rows.recovered_high.values[order]
                ax.errorbar(x.values[order], share, yerr=[share - low, high - share], fmt=style,
                            capsize=2, markersize=3, label=f"{attack}, {label}")  # fmt: skip
        if defense == "dpsgd":
            z = np.geomspace(1e-4, 2.0, 80)
            bound = [accounting_bound(defense, {"norm": 1.0, "noise_multiplier": v}, 1) for v in z]
            ax.plot(z, bound, ":", color="black", linewidth=1.0,
                    label=f"accounting's bound, any attacker (prior {KAPPA:g})")  # fmt: skip
        ax.set_xscale("log")
        ax.set_xlabel(f"{defense}: {parameter}")
        ax.set_ylabel("share of images recovered\nexactly (MSE <= 1e-3)")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.25, linewidth=0.5)
        ax.legend(fontsize=6, framealpha=0.9, edgecolor="none")  # lines pass under, not through
    fig.tight_layout()
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for fmt in ("pdf", "png"):
        path = folder / f"noise.{fmt}"
        fig.savefig(path, dpi=200, metadata={"CreationDate": None} if fmt == "pdf" else None)
        written.append(path)
    return written


def main() -> int:
    rows = []
    for run in sorted(p for p in RESULTS.iterdir() if (p / "trials.csv").is_file()):
        rows += summarise(run)
    out = RESULTS / "summary.csv"
    write_rows(out, COLUMNS, rows)
    prior = [near_duplicates(RESULTS / run) for run in NOISE_RUNS]
    write_rows(RESULTS / "prior.csv", PRIOR_COLUMNS, prior)
    print(pd.DataFrame(prior, columns=PRIOR_COLUMNS).to_string(index=False))
    frame = pd.DataFrame(rows, columns=COLUMNS)
    figures = noise_figure(frame, RESULTS / "figures")
    drawn = [str(path.relative_to(RESULTS)) for path in figures]
    outputs = ", ".join([out.name, "prior.csv", *drawn])
    write_run_record(RESULTS, outputs, script_command(__file__, []))
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(frame.drop(columns=["attack_params", "run"]).round(3).to_string(index=False))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
