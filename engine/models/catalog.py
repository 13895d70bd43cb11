"""The models Tandem knows about: built-in, already on disk (converted GGUFs, the hub cache and the
GGUF files downloaded from it), local folders the user named, and the catalogue of suggested hub
models in resources/models.json.

Each entry says its size and tokenizer family, and `drafts_for` says which can draft for a target:
by the real compatibility check when both tokenizers are on disk, by declared family otherwise.
"""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from engine.errors import TandemError
from engine.models.builtin import BUILTIN_MODELS, BUILTIN_PREFIX, COMPLETE_MARKER, converted_dir, is_converted
from engine.paths import models_cache_dir


@dataclass
class CatalogEntry:
    spec: str  # what load_model takes
    name: str
    source: str  # "builtin", "gguf-cache", "hub-cache", "local" or "catalogue"
    family: str | None = None  # tokenizer family, e.g. "qwen2.5"; None when unknown
    vocab_size: int | None = None  # tokenizer vocabulary, not embedding rows
    size_bytes: int | None = None  # on disk
    params: int | None = None
    hub_id: str | None = None
    folder: Path | None = None  # a loadable safetensors folder, when one is on disk
    roles: list[str] = field(default_factory=lambda: ["target", "draft"])
    file: Path | None = None  # the GGUF file it runs from, when it runs from one on disk
    kv_bytes_per_token: int | None = None  # the catalogue's, for a fit before the download

    @property
    def available_locally(self) -> bool:
        return self.folder is not None

    def to_dict(self) -> dict:
        data = asdict(self)
        data["folder"] = str(self.folder) if self.folder else None
        data["file"] = str(self.file) if self.file else None
        data["available_locally"] = self.available_locally
        return data


def catalogue_path() -> Path:
    """resources/models.json; found through the package path, which works for editable installs too."""
    import resources

    for folder in resources.__path__:
        candidate = Path(folder) / "models.json"
        if candidate.is_file():
            return candidate
    raise FileNotFoundError("resources/models.json is missing from this installation.")


@functools.lru_cache(maxsize=1)
def load_catalogue() -> dict:
    return json.loads(catalogue_path().read_text(encoding="utf-8"))


def _folder_size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def tokenizer_vocab_size(folder: Path) -> int | None:
    """Token count from tokenizer.json (vocabulary plus added tokens), without loading the tokenizer."""
    path = folder / "tokenizer.json"
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    vocab = data.get("model", {}).get("vocab") or {}
    ids = set(vocab.values()) if isinstance(vocab, dict) else set(range(len(vocab)))
    ids.update(token["id"] for token in data.get("added_tokens", []))
    return len(ids) or None


def tokenizer_family(folder: Path) -> tuple[str | None, int | None]:
    """(family, tokenizer vocab size): a catalogue family when model type and vocab match."""
    vocab = tokenizer_vocab_size(folder)
    try:
        model_type = json.loads((folder / "config.json").read_text()).get("model_type")
    except (OSError, ValueError):
        model_type = None
    for name, family in load_catalogue()["families"].items():
        if vocab == family["tokenizer_vocab"] and model_type == family["model_type"]:
            return name, vocab
    if model_type is None or vocab is None:
        return None, vocab
    return f"{model_type}/{vocab}", vocab


def _local_entry(spec: str, name: str, source: str, folder: Path, **extra) -> CatalogEntry:
    family, vocab = tokenizer_family(folder)
    return CatalogEntry(spec, name, source, family, vocab, _folder_size(folder), folder=folder, **extra)


def catalogue_kv_bytes_per_token(item: dict) -> int | None:
    """KV cache bytes a token takes (fp32 K and V, as a CPU reply keeps them), from the catalogue's
    layer and head counts."""
    from engine.models.gguf_hub import KV_BYTES_PER_ELEMENT

    kv = item.get("kv")
    return None if kv is None else 2 * kv["layers"] * kv["kv_heads"] * kv["head_dim"] * KV_BYTES_PER_ELEMENT


def catalogue_entries() -> list[CatalogEntry]:
    entries = []
    for item in load_catalogue()["models"]:
        family = load_catalogue()["families"][item["family"]]
        entries.append(
            CatalogEntry(
                spec=item["spec"],
                name=item["name"],
                source="catalogue",
                family=item["family"],
                vocab_size=family["tokenizer_vocab"],
                size_bytes=item.get("size_bytes"),
                params=item["params"],
                hub_id=item["hub_id"],
                roles=list(item["roles"]),
                kv_bytes_per_token=catalogue_kv_bytes_per_token(item),
            )
        )
    return entries


def builtin_entries() -> list[CatalogEntry]:
    from engine.models.builtin import builtin_gguf_path

    entries = []
    for model in BUILTIN_MODELS.values():
        spec = BUILTIN_PREFIX + model.name
        try:
            path = builtin_gguf_path(model)
        except TandemError:
            continue
        folder = converted_dir(model.name)
        entry = CatalogEntry(spec, model.description, "builtin", size_bytes=path.stat().st_size, file=path)
        if is_converted(folder):  # a float copy made for another precision: compared by its tokenizer
            entry.folder = folder
            entry.family, entry.vocab_size = tokenizer_family(folder)
        entries.append(entry)
    return entries


def cached_gguf_entries() -> list[CatalogEntry]:
    root = models_cache_dir() / "gguf"
    if not root.is_dir():
        return []
    entries = []
    for folder in sorted(root.iterdir()):
        if not is_converted(folder):
            continue
        source = json.loads((folder / COMPLETE_MARKER).read_text()).get("source", "")
        spec = source if source and Path(source).is_file() else str(folder)
        entries.append(_local_entry(spec, Path(source).name or folder.name, "gguf-cache", folder))
    return entries


def hub_cache_entries() -> list[CatalogEntry]:
    """Complete model snapshots in the Hugging Face cache; none if there is no cache."""
    try:
        from huggingface_hub import scan_cache_dir

        info = scan_cache_dir()
    except Exception:  # no cache, an unreadable cache, or an older huggingface_hub
        return []
    entries = []
    for repo in info.repos:
        if repo.repo_type != "model" or not repo.revisions:
            continue
        revisions = sorted(repo.revisions, key=lambda r: ("main" in r.refs, r.last_modified), reverse=True)
        folder = Path(revisions[0].snapshot_path)
        if (folder / "config.json").is_file() and any(folder.glob("*.safetensors")):
            entry = _local_entry(repo.repo_id, repo.repo_id, "hub-cache", folder, hub_id=repo.repo_id)
            entry.size_bytes = repo.size_on_disk
            entries.append(entry)
    return entries


def hub_gguf_entries() -> list[CatalogEntry]:
    """GGUF files downloaded from the hub (engine.models.gguf_hub), one entry per file, the first part of
    a split file standing for it; the spec is the file's path."""
    from engine.models.gguf_hub import SPLIT

    try:
        from huggingface_hub import constants, scan_cache_dir

        info = scan_cache_dir(constants.HF_HUB_CACHE)  # where hf_hub_download put them, read now
    except Exception:  # no cache, an unreadable cache, or an older huggingface_hub
        return []
    entries = []
    for repo in info.repos:
        for revision in repo.revisions if repo.repo_type == "model" else ():
            for cached in sorted(revision.files, key=lambda f: f.file_name):
                split = SPLIT.match(cached.file_name)
                if not cached.file_name.lower().endswith(".gguf") or (split and int(split["part"]) != 1):
                    continue
                path = Path(cached.file_path)
                name = f"{repo.repo_id}/{cached.file_name}"
                entries.append(
                    CatalogEntry(
                        str(path),
                        name,
                        "hub-gguf",
                        size_bytes=cached.size_on_disk,
                        hub_id=repo.repo_id,
                        file=path,
                    )
                )
    return entries


def local_entries(paths) -> list[CatalogEntry]:
    from engine.models.loading import spec_kind

    entries = []
    for path in paths:
        path = Path(path).expanduser()
        kind = spec_kind(str(path))
        if kind == "folder":
            entries.append(_local_entry(str(path), path.name, "local", path))
        elif kind == "gguf":
            entries.append(
                CatalogEntry(str(path), path.name, "local", size_bytes=path.stat().st_size, file=path)
            )
    return entries


def list_models(local_paths=(), include_catalogue: bool = True) -> list[CatalogEntry]:
    """Every known model, one entry per spec; a copy on disk wins over a catalogue suggestion."""
    found: dict[str, CatalogEntry] = {}
    catalogue = {e.spec: e for e in catalogue_entries()} if include_catalogue else {}
    groups = (
        builtin_entries(),
        cached_gguf_entries(),
        hub_cache_entries(),
        hub_gguf_entries(),
        local_entries(local_paths),
    )
    for group in groups:
        for entry in group:
            suggested = catalogue.get(entry.spec)
            if suggested is not None:
                entry.params = entry.params or suggested.params
                entry.hub_id = entry.hub_id or suggested.hub_id
                entry.family = entry.family or suggested.family
                entry.roles = suggested.roles
            found.setdefault(entry.spec, entry)
    for spec, entry in catalogue.items():
        found.setdefault(spec, entry)
    return list(found.values())


@functools.lru_cache(maxsize=16)
def _tokenizer(folder: Path):
    from engine.models.loading import load_tokenizer

    return load_tokenizer(folder)


def can_draft(target: CatalogEntry, draft: CatalogEntry) -> tuple[bool, str]:
    """(ok, reason) for one candidate draft; reason says why not, or how it was decided."""
    from engine.models.compat import compatibility

    if target.folder is not None and draft.folder is not None:
        ok, reason = compatibility(_tokenizer(target.folder), _tokenizer(draft.folder))
        return ok, reason or "tokenizers compared"
    if target.family is None or draft.family is None:
        return False, "tokenizer family unknown until the model is downloaded"
    if target.family != draft.family:
        return False, f"different tokenizer family ({draft.family}, target is {target.family})"
    return True, f"same tokenizer family ({target.family})"


def find_entry(spec: str, entries: list[CatalogEntry]) -> CatalogEntry:
    """The entry for spec, building one for a local path or an unlisted hub id."""
    for entry in entries:
        if spec in (entry.spec, entry.hub_id, entry.name):
            return entry
    found = local_entries([spec]) if Path(spec).expanduser().exists() else []
    return found[0] if found else CatalogEntry(spec, spec, "catalogue", hub_id=spec)


def drafts_for(target_spec: str, entries: list[CatalogEntry] | None = None):
    """[(entry, ok, reason)] for every other known model that could be a draft for the target."""
    entries = entries if entries is not None else list_models()
    target = find_entry(target_spec, entries)
    results = []
    for entry in entries:
        if "draft" not in entry.roles:
            continue
        ok, reason = can_draft(target, entry)
        results.append((entry, ok, reason))
    return results
