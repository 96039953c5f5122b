"""The Tune spec (`kind: Tune`): what to tune, on which target, at which shares, with what budget.

```yaml
kind: Tune
name: tune-cnn
model: plinth.tune.models:small_cnn   # MODULE:FACTORY (a torch.nn.Module), or a .pt2 file
input_shape: [1, 3, 32, 32]
target: cpu                 # cpu or cuda
shares: [1, 2]              # cpu: core counts; cuda: percent of one GPU, e.g. [25, 50, 100]
trials: 64                  # MetaSchedule trials per share, all tasks together
servers: 1                  # tuning servers per share (measure candidates)
clients: 1                  # tuning clients per share (search and build), tasks sharded
builder: local              # or inline: build in the client (saves a process pool a batch)
db: tune-db                 # the tuning database (a folder)
```

Read it with `plinth.core.spec.load_spec`. The model is imported through TVM once here, so
that one TVM cannot import is refused at submission, naming the operator it lacks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from plinth.core.spec import beside, from_folder
from plinth.tune.target import gpu_count

# Whether reading a spec imports its model through TVM (user code). The control plane sets it
# False: it never runs a user's code in its own process (as root that would be the tenant's
# code with the server's rights); `plinth submit` has checked the model before sending it.
IMPORT_MODELS = True

Share = Annotated[float, Field(gt=0, le=100)]
_MODEL = r"^([A-Za-z_][\w.]*:[A-Za-z_]\w*|.+\.pt2)$"


class TuneSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, strict=True)
    run_with: ClassVar[str] = "plinth submit FILE"

    kind: Literal["Tune"] = "Tune"
    name: str = Field("tune", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
    tenant: str | None = None
    priority: int = Field(0, ge=-(2**31), le=2**31 - 1)
    input_shape: list[Annotated[int, Field(ge=1, le=1 << 16)]] = Field(min_length=1,
                                                                      max_length=8)
    target: Literal["cpu", "cuda"] = "cpu"
    shares: list[Share] = Field(min_length=1, max_length=16)
    trials: int = Field(ge=1, le=100_000)
    trials_per_iter: int = Field(16, ge=1, le=1024)
    servers: int = Field(1, ge=1, le=64)
    clients: int = Field(1, ge=1, le=64)
    seed: int = Field(0, ge=0, le=2**31 - 1)
    # local: MetaSchedule's pool of build processes; inline: builds in each client (few cores)
    builder: Literal["local", "inline"] = "local"
    memory: int = Field(2048, ge=64, le=2**40, json_schema_extra={"unit": "MiB"})  # per unit
    db: str = Field("tune-db", min_length=1)
    # Last, so that its (slow) import check runs only once every other field is valid.
    model: str = Field(pattern=_MODEL)

    def submitted(self, base: Path | None) -> TuneSpec:
        """The database and a `.pt2` model beside the spec (as every path in a spec), absolute."""
        return self.model_copy(update={"db": from_folder(base, self.db),
                                       "model": beside(base, self.model)})

    @field_validator("target")
    @classmethod
    def _device_present(cls, v: str) -> str:
        if v == "cuda" and gpu_count() == 0:
            raise ValueError("cuda: this machine has no NVIDIA GPU (the driver reports none); "
                             "use target: cpu")
        return v

    @field_validator("shares")
    @classmethod
    def _shares(cls, v: list[float], info: ValidationInfo) -> list[float]:
        if len(set(v)) != len(v):
            raise ValueError(f"each share once, got {[f'{s:g}' for s in v]}")
        if info.data.get("target") == "cpu":
            bad = [s for s in v if s != int(s)]
            if bad:
                raise ValueError(f"on a cpu target a share is a whole number of cores, "
                                 f"got {bad[0]:g}")
        return sorted(v)

    @field_validator("model")
    @classmethod
    def _importable(cls, v: str, info: ValidationInfo) -> str:
        if not IMPORT_MODELS:  # the control plane: checked by `plinth submit` already
            return v
        others = set(cls.model_fields) - {"model", "kind"}
        if not others <= set(info.data):
            return v  # another field is wrong: that error is the one to read first
        from plinth.tune.model import ImportFailed, relax_module

        try:
            relax_module(v, tuple(info.data["input_shape"]))
        except ImportFailed as e:
            raise ValueError(f"{v}: {e}") from None
        except (ImportError, AttributeError, OSError) as e:
            raise ValueError(f"cannot load {v}: {e}") from None
        except RuntimeError as e:  # torch.export: shape mismatch, untraceable code
            raise ValueError(f"torch.export of {v} at input_shape {info.data['input_shape']} "
                             f"failed: {str(e).splitlines()[0][:200]}") from None
        return v
