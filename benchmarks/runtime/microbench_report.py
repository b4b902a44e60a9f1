"""``microbench.py``'s report: the machine and versions, and the tables (DDLF against
Ray, and TLS against plain TCP) built from the phases' results.
"""

from __future__ import annotations

import os
import platform
from importlib import metadata

import numpy as np

# -- report ----------------------------------------------------------------------------------


def fmt(v: float) -> str:
    if v >= 100:
        return f"{v:,.0f}"
    if v >= 10:
        return f"{v:.1f}"
    if v >= 1:
        return f"{v:.2f}"
    return f"{v:.3g}"


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def machine_info() -> dict:
    try:
        from ddlf_actors import __version__ as ddlf_version
    except Exception:
        ddlf_version = _version("ddlf-actors")
    return {
        "cpus": os.cpu_count() or 1,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "ddlf": ddlf_version,
        "ray": _version("ray"),
        "numpy": np.__version__,
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
    }


def build_rows(results: dict, workloads: list) -> list:
    """One row per workload row of ``workloads`` (``[(fn, [(row, unit)...])...]``)."""
    rows = []
    for _, wl_rows in workloads:
        for row, unit in wl_rows:
            d = results.get("DDLF", {}).get(row)
            r = results.get("Ray", {}).get(row)
            entry = {"workload": row, "unit": unit,
                     "ddlf": d.get("value") if d else None, "ray": r.get("value") if r else None,
                     "ddlf_error": d.get("error") if d else None,
                     "ray_error": r.get("error") if r else None, "ratio": None}
            if entry["ddlf"] is not None and entry["ray"]:
                entry["ratio"] = entry["ddlf"] / entry["ray"]
            rows.append(entry)
    return rows


def print_table(rows: list, machine: dict, ray_note: str) -> None:
    w_name, w_val = 36, 24

    def cell(value, error, unit):
        if error is not None:  # the exception's type here, its message under the table
            text = f"error: {error.split(':', 1)[0]}"
            return text if len(text) <= w_val else text[:w_val - 3] + "..."
        if value is None:
            return "-"
        return f"{fmt(value)} {unit}"

    print()
    print(f"DDLF vs Ray microbenchmark -- {machine['cpus']} CPUs, Python {machine['python']}, "
          f"ddlf {machine['ddlf']}, ray {machine['ray'] or 'not installed'} ({ray_note}), "
          f"numpy {machine['numpy']}, OMP_NUM_THREADS={machine['omp_num_threads']}")
    print(f"platform: {machine['platform']}")
    head = f"{'workload':<{w_name}} | {'DDLF':>{w_val}} | {'Ray':>{w_val}} | {'DDLF/Ray':>8}"
    print(head)
    print("-" * len(head))
    for r in rows:
        ratio = f"{r['ratio']:.2f}x" if r["ratio"] is not None else "-"
        print(f"{r['workload']:<{w_name}} | {cell(r['ddlf'], r['ddlf_error'], r['unit']):>{w_val}}"
              f" | {cell(r['ray'], r['ray_error'], r['unit']):>{w_val}} | {ratio:>8}")
    print("-" * len(head))
    print("DDLF/Ray > 1 means DDLF is faster, except in rows measured in s or x ideal (lower is "
          "better; x ideal is elapsed / (work / CPUs), 1.0 being perfect spreading).")
    errs = [(fw, r["workload"], r[key]) for r in rows
            for fw, key in (("DDLF", "ddlf_error"), ("Ray", "ray_error")) if r[key]]
    if errs:
        print("\nErrors:")
        for fw, row, msg in errs:
            print(f"  {fw} / {row}: {msg}")


def build_tls_rows(results: dict, workloads: list) -> list:
    rows = []
    for _, wl_rows in workloads:
        for row, unit in wl_rows:
            d = results.get("DDLF", {}).get(row) or {}
            t = results.get("DDLF TLS", {}).get(row) or {}
            entry = {"workload": row, "unit": unit, "plain": d.get("value"),
                     "tls": t.get("value"), "plain_error": d.get("error"),
                     "tls_error": t.get("error"), "ratio": None}
            if entry["plain"] and entry["tls"] is not None:
                entry["ratio"] = entry["tls"] / entry["plain"]
            rows.append(entry)
    return rows


def print_tls_table(rows: list) -> None:
    w_name, w_val = 36, 18

    def cell(value, error, unit):
        if error is not None:
            return f"error: {error.split(':', 1)[0]}"[:w_val]
        return "-" if value is None else f"{fmt(value)} {unit}"

    print()
    print("DDLF plain vs DDLF with mutual TLS (--tls; same run, same machine)")
    head = f"{'workload':<{w_name}} | {'DDLF plain':>{w_val}} | {'DDLF TLS':>{w_val}} | {'TLS/plain':>9}"
    print(head)
    print("-" * len(head))
    for r in rows:
        ratio = f"{r['ratio']:.2f}x" if r["ratio"] is not None else "-"
        print(f"{r['workload']:<{w_name}} | {cell(r['plain'], r['plain_error'], r['unit']):>{w_val}}"
              f" | {cell(r['tls'], r['tls_error'], r['unit']):>{w_val}} | {ratio:>9}")
    print("-" * len(head))
    print("TLS/plain below 1 is what encryption costs (TLS 1.3, AES-256-GCM with OpenSSL here).")
    errs = [(r["workload"], r["tls_error"]) for r in rows if r["tls_error"]]
    for row, msg in errs:
        print(f"  DDLF TLS / {row}: {msg}")
