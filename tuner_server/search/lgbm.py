"""Model-based search: a LightGBM LambdaRank cost model, refitted on the task's records
every plan, ranks candidates found by simulated annealing (or, where the valid configs
can be listed, all of them); a diversity filter spreads the plan and a share of it is
random. With a global model (transfer), the first plans are guided before anything of
this task was measured, and the global model's weight decays as the task's own records
grow."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from compiler.templates import Template
from schemas import DeviceLimits, Workload
from tuner_server.search.base import Measured, Tuner, Visited
from tuner_server.search.cost_model import CostModel, FitParams
from tuner_server.search.sa import PoolWalk, Score, SimulatedAnnealing, SpaceWalk
from tuner_server.search.transfer import GlobalModel

EXPLORERS = ("auto", "sa", "exhaustive")
# The task's model learns from at most this many measured configs: a fit's time grows
# with its rows (4,096 took half the time of 10,000 here), and a plan must not slow down
# as a task grows old.
MAX_FIT = 4096
Predict = Callable[[np.ndarray], np.ndarray]  # features -> scores


class LGBMTuner(Tuner):
    name = "lgbm"
    needs_history = True
    uses_prior = True

    def __init__(self, template: Template, workload: Workload,
                 limits: DeviceLimits | None = None, seed: int = 0,
                 pool: Sequence[int] | np.ndarray | None = None,
                 prior: GlobalModel | Callable[[], GlobalModel | None] | None = None,
                 explorer: str = "auto",
                 epsilon: float = 0.1, min_fit: int = 8, decay: float = 32.0,
                 diversity: float = 2.0, fit: FitParams | None = None,
                 max_fit: int = MAX_FIT) -> None:
        super().__init__(template, workload, limits, seed, pool)
        if explorer not in EXPLORERS:
            raise ValueError(f"explorer {explorer!r} is not one of {', '.join(EXPLORERS)}")
        self._prior, self.explorer = prior, explorer
        self.epsilon, self.min_fit, self.decay, self.diversity = epsilon, min_fit, decay, diversity
        self.max_fit = max_fit
        self.fit_params = fit or FitParams()
        walk = PoolWalk(self.space, self.pool) if self.pool is not None else SpaceWalk(self.space)
        self.annealer = SimulatedAnnealing(walk)

    @property
    def prior(self) -> GlobalModel | None:
        """The global model (transfer), or the newest one a provider has: the server
        fits it apart, so it may land after this tuner was made."""
        return self._prior() if callable(self._prior) else self._prior

    def prior_weight(self, n_ok: int, has_local: bool) -> float:
        """The global model's share of the score: all of it before the task's own model
        exists, half at ``decay`` working records of the task, then less and less."""
        if self.prior is None:
            return 0.0
        return self.decay / (self.decay + n_ok) if has_local else 1.0

    def propose(self, n: int, visited: Visited, measured: Measured) -> np.ndarray:
        if n <= 0:
            return np.empty(0, dtype=np.int64)
        rng = self.rng(visited)
        n_ok = int((measured.perf > 0).sum())
        rows = self._training_rows(measured, rng)
        indices, perf = measured.indices[rows], measured.perf[rows]
        local = None
        if n_ok >= 2 and len(measured) >= self.min_fit:
            local = CostModel(self.fit_params, self.seed).fit(
                self.template.feature_matrix(self.workload, indices), perf)
        prior = self.prior  # one model for the whole batch, though a newer may land
        if local is None and prior is None:
            return self.random_indices(n, visited, rng)
        score = self._scorer(local, prior, self.prior_weight(n_ok, local is not None),
                             indices, rng)
        n_random = int(round(self.epsilon * n)) if n > 2 else 0
        picks = self._explore(score, n - n_random, visited, measured, rng)
        extra = self.random_indices(n - len(picks), visited, rng, exclude=picks)
        return np.concatenate([picks, extra])

    def _training_rows(self, measured: Measured, rng: np.random.Generator) -> np.ndarray:
        """Positions of the measured configs the task's model learns from: all of them
        up to ``max_fit``; past that the best quarter and a uniform sample of the rest,
        so that a plan late in a long task fits as fast as one early in it."""
        if len(measured) <= self.max_fit:
            return np.arange(len(measured))
        best = measured.best(self.max_fit // 4)
        rest = np.setdiff1d(np.arange(len(measured)), best, assume_unique=True)
        return np.concatenate([best, rng.choice(rest, self.max_fit - len(best), replace=False)])

    def _scorer(self, local: CostModel | None, prior: GlobalModel | None, weight: float,
                measured: np.ndarray, rng: np.random.Generator) -> Score:
        """indices -> blended score (-inf where invalid). Each model's score is
        standardised by its spread on a fixed sample, so that blends are comparable."""
        models: list[tuple[float, Predict]] = []
        if prior is not None and weight > 0:
            models.append((weight, prior.model.predict))
        if local is not None and weight < 1:
            models.append((1 - weight, local.predict))
        sample = np.concatenate([measured, self.random_indices(256, Visited(), rng)])
        feats = self.template.feature_matrix(self.workload, sample)
        scaled = []
        for w, predict in models:
            ref = predict(feats)
            scaled.append((w, predict, float(ref.mean()), float(ref.std()) or 1.0))

        def score(idx: np.ndarray) -> np.ndarray:
            out = np.zeros(len(idx))
            if len(idx):
                x = self.template.feature_matrix(self.workload, idx)
                for w, predict, mu, sd in scaled:
                    out += w * (predict(x) - mu) / sd
            return np.where(self.valid(idx), out, -np.inf)
        return score

    def _explore(self, score: Score, n: int, visited: Visited, measured: Measured,
                 rng: np.random.Generator) -> np.ndarray:
        """The plan's model-chosen part: the top candidates, spread by diversity."""
        want = max(int(self.diversity * n), n)
        listed = self.candidates(visited) if self.explorer != "sa" else None
        if listed is not None:
            scores = score(listed)
            top = np.argsort(-scores)[:want]
            cand, cand_scores = listed[top], scores[top]
        else:
            # chains restart from the best measured configs; the rest continue from where
            # the last plan left them (random points on the first plan)
            best = measured.indices[measured.best(self.annealer.n_chains // 2)]
            rest = (self.annealer.points if self.annealer.points is not None
                    else self.random_indices(self.annealer.n_chains, Visited(), rng))
            start = np.concatenate([best, rest])
            cand, cand_scores = self.annealer.explore(score, want, start, visited.contains,
                                                      rng)
        keep = np.isfinite(cand_scores)
        return np.array(diverse_pick(self.space.positions(cand[keep]), cand[keep],
                                     cand_scores[keep], n), dtype=np.int64)


def diverse_pick(positions: np.ndarray, indices: np.ndarray, scores: np.ndarray,
                 n: int, score_weight: float = 0.05) -> list[int]:
    """Greedy submodular pick among the top candidates (AutoTVM's diversity filter):
    each step takes the candidate with the largest share of knob values not yet in the
    pick; the model's score (standardised, times ``score_weight``) breaks near-ties. A
    plan then covers its candidates' neighbourhoods instead of collapsing onto one."""
    if len(indices) <= n:
        return indices.tolist()
    z = (scores - scores.mean()) / (scores.std() or 1.0)
    covered = np.zeros_like(positions, dtype=bool)
    chosen: list[int] = []
    free = np.ones(len(indices), dtype=bool)
    for _ in range(n):
        gain = np.where(free, (~covered).mean(axis=1) + score_weight * z, -np.inf)
        best = int(np.argmax(gain))
        chosen.append(int(indices[best]))
        free[best] = False
        covered |= positions == positions[best]
    return chosen
