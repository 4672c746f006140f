"""A dataset in a local folder laid out as the Hugging Face Hub lays one (Parquet files under one folder per
configuration, a README whose YAML names the configurations and their splits), which ``datasets`` reads as it
reads a Hub repository when ``HF_DATASETS_OFFLINE`` is set: the hub sources' code (peer_agent/sources.py) run
with nothing downloaded, by the tests of hub sources and by bench/rehearsal.py."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


def hub_folder_write(folder: Path, configs: Mapping[str, Mapping[str, Sequence[str]]], *,
                     text_column: str = "text", shards: int = 1) -> Path:
    """Write ``configs`` (configuration -> split -> documents) into ``folder`` as wikimedia/wikipedia lays out
    its configurations: ``<configuration>/<split>-0000i-of-0000n.parquet`` with an ``id``, a ``title`` and the
    documents in ``text_column``, each split in ``shards`` files, and a README naming them. Returns ``folder``."""
    lines = ["---", "configs:"]
    for config, splits in configs.items():
        (folder / config).mkdir(parents=True, exist_ok=True)
        lines += [f"- config_name: {config}", "  data_files:"]
        for split, texts in splits.items():
            lines += [f"  - split: {split}", f"    path: {config}/{split}-*"]
            size = -(-len(texts) // shards)
            for shard in range(shards):
                part = list(texts[shard * size:(shard + 1) * size])
                first = shard * size
                table = pa.table({"id": [str(first + n) for n in range(len(part))], "title": ["t"] * len(part),
                                  text_column: part})
                pq.write_table(table, folder / config / f"{split}-{shard:05d}-of-{shards:05d}.parquet")
    (folder / "README.md").write_text("\n".join([*lines, "---", ""]))
    return folder
