"""The AppWorld worker: runs under the Python of a separate environment that has the ``appworld``
package and its data (AppWorld pins pydantic<2, seeupo needs pydantic 2, so they cannot share one
environment). seeupo starts it as ``PYTHON appworld_worker.py`` and speaks one JSON object per line:

    {"op": "tasks", "split": "train"}                 -> {"ok": true, "task_ids": [...]}
    {"op": "start", "task_id": ..., "experiment": ...} -> {"ok": true, "instruction": ..., "supervisor": {...}}
    {"op": "execute", "code": ...}                     -> {"ok": true, "output": ..., "completed": bool}
    {"op": "evaluate"}                                 -> {"ok": true, "success": bool, "passes": n, "total": n}
    {"op": "close"}                                    -> {"ok": true}

Any failure answers {"ok": false, "error": "..."}. This file imports only the standard library and
``appworld``; it is not imported by seeupo itself.
"""

import json
import sys


def main() -> None:
    try:
        import appworld
        from appworld import AppWorld, load_task_ids
    except Exception as e:  # the package is missing or broken in this environment
        print(json.dumps({"ok": False, "error": f"cannot import appworld under {sys.executable}: {e!r}"}), flush=True)
        return
    print(json.dumps({"ok": True, "version": getattr(appworld, "__version__", "?")}), flush=True)
    world = None
    for line in sys.stdin:
        msg = json.loads(line)
        op = msg.get("op")
        try:
            if op == "tasks":
                out = {"task_ids": list(load_task_ids(msg["split"]))}
            elif op == "start":
                if world is not None:
                    world.close()
                world = AppWorld(task_id=msg["task_id"], experiment_name=msg.get("experiment", "seeupo"))
                sup = world.task.supervisor
                out = {"instruction": world.task.instruction,
                       "supervisor": {k: getattr(sup, k, None) if not isinstance(sup, dict) else sup.get(k)
                                      for k in ("first_name", "last_name", "email", "phone_number")}}
            elif op == "execute":
                output = world.execute(msg["code"])
                out = {"output": str(output), "completed": bool(world.task_completed())}
            elif op == "evaluate":
                tracker = world.evaluate()
                d = tracker.to_dict() if hasattr(tracker, "to_dict") else {}
                passes = d.get("num_passes", len(d.get("passes", [])))
                total = d.get("num_tests", passes + len(d.get("failures", [])))
                out = {"success": bool(d.get("success", getattr(tracker, "success", False))),
                       "passes": passes, "total": total}
            elif op == "close":
                if world is not None:
                    world.close()
                    world = None
                out = {}
            else:
                raise ValueError(f"unknown op {op!r}")
            print(json.dumps({"ok": True, **out}), flush=True)
        except Exception as e:
            print(json.dumps({"ok": False, "error": repr(e)}), flush=True)


if __name__ == "__main__":
    main()
