"""The credit columns of the totals (runs.models.CreditSums and RunCreditTotal), each declared once
with what it is; the lists the rollup (runs/credit/rollup.py) and the rebuild (runs/credit/rebuild.py)
work through are derived from this declaration."""

from dataclasses import dataclass

REPORTED, SPLIT, BUCKETS = "reported", "split", "buckets"


@dataclass(frozen=True)
class CreditColumn:
    """A summed column: a volunteer's all-runs total, a team's total and a run's total are sums of it.

    ``source`` says where a volunteer's figure comes from: ``reported`` (added up from the
    contribution events), ``split`` (recomputed from the SessionEpoch decisions) or ``buckets``
    (the sum of the hourly buckets in its window). ``window`` and ``measure`` name what a board
    shows it as: the confirmed ``samples`` or ``credit`` of the "all", "24h" or "7d" window.
    ``run_total``: RunCreditTotal keeps it too."""

    name: str
    source: str
    window: str | None = None
    measure: str | None = None
    run_total: bool = True

    @property
    def zero(self) -> int | float:
        """Samples are counted in integers; seconds and credit are floats."""
        return 0 if self.name.startswith("samples") else 0.0


COLUMNS = (
    CreditColumn("samples", REPORTED),
    CreditColumn("compute_seconds", REPORTED, run_total=False),
    CreditColumn("samples_verified", SPLIT, window="all", measure="samples"),
    CreditColumn("samples_rejected", SPLIT),
    CreditColumn("credit_provisional", SPLIT),
    CreditColumn("credit_verified", SPLIT),
    CreditColumn("credit", SPLIT, window="all", measure="credit"),
    CreditColumn("samples_24h", BUCKETS, window="24h", measure="samples"),
    CreditColumn("credit_24h", BUCKETS, window="24h", measure="credit"),
    CreditColumn("samples_7d", BUCKETS, window="7d", measure="samples"),
    CreditColumn("credit_7d", BUCKETS, window="7d", measure="credit"),
)
# What a total holds besides its sums: RAC decays (summed decayed to one moment), last seen is the latest.
RAC_FIELDS = ("recent_average_credit", "rac_updated_at")
ROW_FIELDS = (*RAC_FIELDS, "last_seen_at")

SUMMED = tuple(column.name for column in COLUMNS)
ZEROS = {column.name: column.zero for column in COLUMNS}
SPLIT_FIELDS = tuple(column.name for column in COLUMNS if column.source == SPLIT)
BUCKETED = tuple(column for column in COLUMNS if column.source == BUCKETS)
# What the rollup adds to a team's totals as its members' figures change; the windows come from its buckets.
TEAM_ADDED = tuple(column.name for column in COLUMNS if column.source != BUCKETS)
RUN_TOTAL = tuple(column.name for column in COLUMNS if column.run_total)
# What run_credit_derive recomputes that a run's total sums: the run gets the difference it makes.
RUN_DERIVED = tuple(column.name for column in COLUMNS if column.run_total and column.source != REPORTED)
# window -> (samples column, credit column): what a board ranks by in each window.
WINDOWS = {
    window: tuple(next(column.name for column in COLUMNS if (column.window, column.measure) == (window, measure))
                  for measure in ("samples", "credit"))
    for window in ("24h", "7d", "all")
}
# window -> (members column, machines column) of a team's totals: its current members with confirmed
# samples in the window, and their machines.
TEAM_COUNTED = {window: (f"members{suffix}", f"machines{suffix}") for window, suffix in (("24h", "_24h"), ("7d", "_7d"),
                                                                                        ("all", ""))}
