"""python/README.md's "Use" block runs as written at every size (1-4 ranks)."""
import pathlib
import re

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def test_readme_use_block_runs(comm):
    text = README.read_text()
    use = text[text.index("## Use"):]
    block = re.search(r"```python\n(.*?)```", use, re.S).group(1)
    assert "dlpack_mpi.Comm()" in block
    exec(compile(block, str(README), "exec"), {})
