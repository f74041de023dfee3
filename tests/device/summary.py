"""The short table printed last by run_all.sh, from $OUT/*.json and the logs."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

OUT = Path(os.environ.get("OUT", "/tmp/tinychat-device-out"))


def load(name: str) -> dict:
    path = OUT / name
    return json.loads(path.read_text()) if path.exists() else {}


def ok(value) -> bool:
    return isinstance(value, dict) and "error" not in value


def kernel_lines(k: dict) -> list[tuple[str, str]]:
    lines = []
    if ok(k.get("bandwidth")):
        b = k["bandwidth"]
        rate = f"{b['read_plus_write_tb_s']} / {b['read_tb_s']} TB/s"
        lines.append(("D2D copy, read+write / read", rate))
    if ok(k.get("gemm")):
        lines.append(("bf16 GEMM 8192^3", f"{k['gemm'].get('8192x8192x8192_tflop_s')} TFLOP/s"))
    for key, value in k.get("full_size_vs_numpy", {}).items():
        if isinstance(value, dict):
            v = value.get("l2_rel", value.get("mismatches"))
            lines.append((f"  {key}", f"{v:.2e}" if isinstance(v, float) else str(v)))
        else:
            lines.append((f"  {key}", str(value)))
    fused = k.get("fused_ops_vs_numpy", {})
    for key, value in fused.items() if ok(fused) else ():
        if ok(value):  # the worst of the case's ops
            errs = {op: e for op, e in value.items() if isinstance(e, dict)}
            op = max(errs, key=lambda o: (errs[o]["nan"] > 0, errs[o]["l2_rel"]))
            nans = sum(e["nan"] for e in errs.values())
            text = f"{errs[op]['l2_rel']:.2e} ({op}, {value.get('path')} path)"
            text += f", {nans} NaN" if nans else ""
            lines.append((f"  fused ops vs cpu, {key}, worst l2 rel", text))
    for b, t in k.get("decode_kernel_times_us", {}).items():
        if ok(t):
            text = f"{t.get('step_sum_us')} us ({t.get('path')} path)"
            lines.append((f"decode step, sum of GPU times, {b}", text))
    for key, value in k.items():
        if isinstance(value, dict) and "error" in value:
            lines.append((key, "ERROR " + value["error"][:80]))
    return lines


def model_lines(m: dict) -> list[tuple[str, str]]:
    lines = []
    for key, value in m.items():
        if not ok(value):
            if isinstance(value, dict):
                lines.append((key, "ERROR " + value["error"][:80]))
            continue
        if key.startswith("model_"):
            for ref in ("cpu", "hf_float32", "hf_bfloat16"):
                err = value.get(f"last_position_logits_vs_{ref}")
                if err:
                    lines.append((f"{key} logits vs {ref}, l2 rel", f"{err['l2_rel']:.2e}"))
            for ref in ("cpu", "hf_float32", "hf_bfloat16"):
                g = value.get(f"greedy_vs_{ref}")
                if g:
                    text = f"{g['agree_steps']}/{g['of']} agree, ok={g['ok']}"
                    lines.append((f"{key} greedy vs {ref}", text))
        elif key.startswith("batch_invariance"):
            n = len(value["per_prompt"])
            lines.append((key, f"identical {value['identical']}/{n}, all_ok={value['all_ok']}"))
        elif key.startswith("eager"):
            for b in ("batch_1", "batch_64"):
                if b in value:
                    lines.append((f"eager decode {b}", f"{value[b]['tok_s']} tok/s"))
    return lines


def main() -> None:
    lines = []
    log = OUT / "kernel_tests.log"
    if log.exists():
        tail = [t for t in log.read_text().splitlines() if re.search(r"passed|failed|error", t)]
        lines.append(("kernel tests (pytest, real GPU)", tail[-1] if tail else "?"))
    lines += kernel_lines(load("check_kernels.json"))
    lines += model_lines(load("check_model.json"))
    san = OUT / "sanitizer.log"
    if san.exists():
        found = re.findall(r"ERROR SUMMARY: (\d+) error", san.read_text())
        lines.append(("compute-sanitizer memcheck", f"{found[-1] if found else '?'} errors"))
    width = max((len(a) for a, _ in lines), default=10)
    table = "\n".join(f"{a:<{width}}  {b}" for a, b in lines)
    (OUT / "summary.txt").write_text(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
