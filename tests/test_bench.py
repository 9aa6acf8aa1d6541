"""`attnlab bench` runs a chosen row group and writes its table (the speeds themselves live in
benchmarks/README.md, not in tests)."""

import json

from attnlab.cli import main


def test_bench_only_encdec_writes_json_and_markdown(tmp_path, capsys):
    js, md = tmp_path / "bench.json", tmp_path / "bench.md"
    assert (
        main(["bench", "--quick", "--only", "encdec", "--device", "cpu", "--json", str(js), "--markdown", str(md)]) == 0
    )
    rows = json.loads(js.read_text())["rows"]
    assert [r["baseline is"] for r in rows] == ["torch.nn.Transformer"]
    assert rows[0]["attnlab"] > 0 and rows[0]["baseline"] > 0
    assert rows[0]["ratio"] == rows[0]["attnlab"] / rows[0]["baseline"]
    assert "enc-dec train" in md.read_text() and "enc-dec train" in capsys.readouterr().out
