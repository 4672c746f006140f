"""A run's hub sources: read as one stream of documents, and checked before anyone relies on them.

The agents (peer_agent/data.py), the validator's spot-check replay, the evaluation and the portal's
worker (tokenizer sample, the check when an organizer saves the run) all read the sources here, so
that they agree on which documents exist and in what order. This module imports ``datasets`` and
the shared contract only: the portal's worker may import it.
"""

from __future__ import annotations

import datasets

from peer_agent.protocol import DataConfig, HubSource

_EXAMPLE = "wikimedia/wikipedia with configuration 20231101.bn"


def hub_documents(data: DataConfig, *, seed: int, split: str | None = None) -> datasets.IterableDataset:
    """The hub sources' documents as one stream of ``{"text": document}``, unshuffled.

    Each source streams its split (``split`` instead, e.g. a validation split); several sources are
    mixed by their probabilities, drawn with ``seed``, so that the same seed gives the same mixture
    on every machine. The mixture runs until every source has been read through once ("all
    exhausted"): the smaller sources come round again, and the larger ones are read in full.
    """
    streams = []
    for source in data.hub:
        stream = datasets.load_dataset(source.path, source.name, split=split or source.split, streaming=True)
        if source.text_column != "text":
            stream = stream.rename_column(source.text_column, "text")
        streams.append(stream.select_columns(["text"]))
    if len(streams) == 1:
        return streams[0]
    total = sum(source.probability for source in data.hub)
    return datasets.interleave_datasets(streams, probabilities=[source.probability / total for source in data.hub],
                                        seed=seed, stopping_strategy="all_exhausted")


def hub_sources_problems(data: DataConfig, *, validation_split: str | None = None) -> list[str]:
    """What keeps the hub sources from loading, one sentence per problem (none: they load).

    Each source's configurations, splits and columns are resolved as ``datasets`` resolves them
    (on the Hub, or in a local folder with ``HF_DATASETS_OFFLINE``); ``validation_split``, when the
    evaluation reads one, must exist in every source too.
    """
    problems = []
    for number, source in enumerate(data.hub, start=1):
        label = f"source {number} ({source.path})" if len(data.hub) > 1 else f"the hub source {source.path}"
        problem = _source_problem(source, validation_split=validation_split)
        if problem:
            problems.append(f"{label[0].upper()}{label[1:]}: {problem}")
    return problems


def _source_problem(source: HubSource, *, validation_split: str | None) -> str | None:
    try:
        configurations = datasets.get_dataset_config_names(source.path)
    except RuntimeError as exc:
        if "scripts are no longer supported" not in str(exc):
            raise
        script = str(exc).rsplit(" ", 1)[-1]
        return (f"it needs a loading script ({script}), which datasets 4 and later no longer run; choose a dataset "
                f"stored as Parquet or Arrow files, such as {_EXAMPLE}.")
    except (FileNotFoundError, ConnectionError, datasets.exceptions.DatasetNotFoundError) as exc:
        return f"no such dataset could be read ({exc}); check its id on the Hugging Face Hub, or the folder's path."
    named = ", ".join(configurations)
    if source.name is None and len(configurations) > 1:
        return f"it has several configurations ({named}); name one."
    if source.name is not None and source.name not in configurations:
        return f"it has no configuration “{source.name}”; it has {named}."
    builder = datasets.load_dataset_builder(source.path, source.name)
    splits = list(builder.config.data_files or builder.info.splits or {})
    wanted = [source.split, *([validation_split] if validation_split else [])]
    missing = [split for split in wanted if split not in splits]
    if missing:
        return (f"it has no split “{missing[0]}”; it has {', '.join(splits)}."
                + (" Hold out documents by hash instead of a validation split." if missing[0] == validation_split else ""))
    stream = datasets.load_dataset(source.path, source.name, split=source.split, streaming=True)
    columns = list(stream.features or next(iter(stream.take(1)), {}))
    if source.text_column not in columns:
        return f"it has no column “{source.text_column}”; it has {', '.join(columns) or 'no rows'}."
    return None
