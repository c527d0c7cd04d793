"""The selftest's report: the JSON document and its markdown rendering.

The markdown starts with the machine and the estimate, lists the plan (and what this machine
cannot run, with why), gives one section per check (status, wall time against its budget,
detail, table, commands to rerun it alone) and ends with the summary table and the verdict.
"""

from __future__ import annotations

from typing import Any, Sequence

from ._runner import Check, NotRun, estimate

__all__ = ["document", "markdown", "plan_markdown", "table_markdown"]


def document(mode: str, device: dict, checks: Sequence[Check], records: list[dict],
             not_run: Sequence[NotRun], gpu_estimate: float, quick: bool, total_s: float,
             source: str | None) -> dict[str, Any]:
    """The JSON document (``--json``)."""
    return {"gpu": mode == "gpu", "mode": mode, "quick": quick, "device": device,
            "source_tree": source, "estimate_s": estimate(checks),
            "estimate_gpu_s": gpu_estimate, "total_s": round(total_s, 2),
            "ok": bool(records) and all(r["ok"] for r in records), "checks": records,
            "not_run": [{"name": n.name, "budget_s": n.budget_s, "what": n.what,
                         "reason": n.reason} for n in not_run]}


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def table_markdown(rows: Sequence[dict]) -> list[str]:
    """A markdown table of ``rows`` (the union of their keys, in first-seen order)."""
    if not rows:
        return []
    keys: list[str] = []
    for row in rows:
        keys += [k for k in row if k not in keys]
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(_cell(row.get(k)) for k in keys) + " |" for row in rows]
    return lines


def _header(mode: str, device: dict) -> str:
    if mode == "gpu":
        peak = device.get("peak_bandwidth_gbs")
        return (f"GPU: {device['count']} x {device['name']} (compute capability "
                f"{device['compute_capability']}, {device['memory_gib']} GiB, peak "
                f"{peak if peak is not None else 'n/a'} GB/s), CuPy {device.get('cupy')}")
    return (f"no GPU ({device.get('why', 'no CUDA device')}): the emulated equivalents run "
            "(cupycoll.testing.emulation, NVRTC without a device, the CPU kernel shim)")


def plan_markdown(mode: str, device: dict, checks: Sequence[Check], not_run: Sequence[NotRun],
                  gpu_estimate: float) -> list[str]:
    """The report's start (also what ``--list`` prints): machine, estimate, plan, not run."""
    lines = ["# cupycoll selftest", "", f"- machine: {_header(mode, device)}",
             f"- estimate: {estimate(checks):.0f} s (the sum of the budgets below)"]
    if mode != "gpu":
        lines.append(f"- estimate of the GPU run on one GPU: {gpu_estimate:.0f} s")
    lines += ["", "## Plan", ""]
    lines += table_markdown([{"#": i, "check": c.name, "budget (s)": c.budget_s,
                              "what": c.what} for i, c in enumerate(checks, 1)])
    if not_run:
        lines += ["", "## Not run here", ""]
        lines += table_markdown([{"check": n.name, "budget (s)": n.budget_s, "why": n.reason,
                                  "what": n.what} for n in not_run])
    return lines


def markdown(doc: dict, checks: Sequence[Check], not_run: Sequence[NotRun]) -> str:
    """The whole report of a run."""
    lines = plan_markdown(doc["mode"], doc["device"], checks, not_run, doc["estimate_gpu_s"])
    lines += ["", "## Results"]
    for i, r in enumerate(doc["checks"], 1):
        state = "ok" if r["ok"] else "FAILED"
        over = " (over budget)" if r["over_budget"] else ""
        lines += ["", f"### {i}. {r['name']}: {state}, {r['seconds']:.1f} s of "
                  f"{r['budget_s']:.0f} s{over}", "", r["what"] + ".", ""]
        detail = r["detail"].strip()
        lines += ["```", detail, "```"] if "\n" in detail else [detail]
        if r.get("table"):
            lines += [""] + table_markdown(r["table"])
        for command in r.get("commands", []):
            lines += ["", f"    {command}"]
    lines += ["", "## Summary", ""]
    lines += table_markdown([{"check": r["name"], "result": "ok" if r["ok"] else "FAILED",
                              "seconds": r["seconds"], "budget (s)": r["budget_s"]}
                             for r in doc["checks"]]
                            + [{"check": "total", "result": "", "seconds": doc["total_s"],
                                "budget (s)": doc["estimate_s"]}])
    failed = [r["name"] for r in doc["checks"] if not r["ok"]]
    verdict = (f"FAILED: {', '.join(failed)}" if failed else
               "FAILED: no check ran here" if not doc["checks"] else
               "PASSED: every check that ran is ok")
    lines += ["", f"**{verdict}** ({len(doc['checks']) - len(failed)} of {len(doc['checks'])} "
              f"checks ok, {len(doc['not_run'])} not run here)", ""]
    return "\n".join(lines)
