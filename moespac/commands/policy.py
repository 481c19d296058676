"""`moespac policy list`: every registered scheduling policy with its flags and source."""

from __future__ import annotations

from moespac.registry import policies


def policy_table() -> list[list[str]]:
    """Header plus one row per policy, sorted by name."""
    rows = [["NAME", "LOSSLESS", "NEEDS_DRAFT", "REQUIRES", "SOURCE"]]
    for name, cls in sorted(policies().items()):
        rows.append([name, "yes" if cls.lossless else "no", "yes" if cls.needs_draft else "no",
                     ",".join(cls.requires) or "-", cls.source or "-"])
    return rows


def list_policies(args) -> int:
    rows = policy_table()
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:  # the last column (source) is left ragged
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])
    return 0


def register(sub) -> None:
    p = sub.add_parser("policy", help="scheduling policies (MoE-SpAc and the baselines)")
    psub = p.add_subparsers(dest="policy_command", required=True, metavar="ACTION")
    ls = psub.add_parser("list", help="print every registered policy with its flags (lossless, needs_draft, "
                                      "requires) and source")
    ls.set_defaults(func=list_policies)
