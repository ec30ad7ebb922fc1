"""Runs the bundled notebook top to bottom in its own Jupyter kernel (tests/e2e and tests/connect)."""

import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(ROOT, "examples", "notebook", "tfos_step_by_step.ipynb")


def run_notebook(tmp_path, monkeypatch, remote=None) -> str:
    """Execute the notebook's cells in a fresh kernel (``TFOS_NOTEBOOK_REMOTE=remote`` when given: the
    kernel's session is then a Spark Connect one) and return what the cells printed and showed."""
    import nbclient
    import nbformat

    if remote:
        monkeypatch.setenv("TFOS_NOTEBOOK_REMOTE", remote)
    else:
        # A Connect session made earlier in this process marks the environment as Connect mode
        # (pyspark sets SPARK_CONNECT_MODE_ENABLED); the kernel would inherit it and refuse a
        # classic session. The classic variant's kernel gets a classic environment.
        for name in ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "SPARK_LOCAL_REMOTE", "TFOS_NOTEBOOK_REMOTE"):
            monkeypatch.delenv(name, raising=False)
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    return "".join(o.get("text", "") + o.get("data", {}).get("text/plain", "")
                   for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
