"""The spec's ``notify:``, ``energy:`` and ``job.tracking`` blocks (docs/notify.md, docs/energy.md,
docs/tracking.md). Secrets are named, never written: ``url_secret`` / ``smtp_secret`` / ``api_key_secret`` name
local environment variables read when a message is sent."""

from __future__ import annotations

import re
import shlex
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator

from gtrain.errors import ConfigError
from gtrain.spec.data import has_control, no_control, system_dir, url_credentials

EVENTS = ("succeeded", "failed", "cancelled", "preempted", "recovered", "budget_80", "budget_reached",
          "idle_stopped", "health_failed")
DEFAULT_EVENTS = ["succeeded", "failed", "preempted", "recovered", "budget_80", "budget_reached", "idle_stopped",
                  "health_failed"]
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_EMAIL = re.compile(r"^[^@\s,;<>\x00-\x1f\x7f]+@[^@\s,;<>\x00-\x1f\x7f]+\.[^@\s,;<>\x00-\x1f\x7f]+\Z")
_SECRET_FIX = "name the local environment variable that holds the secret (letters, digits, _), never the secret itself"


def secret_name(field: str) -> BeforeValidator:
    """A field naming a local environment variable; a URL, credential or control character there is refused
    without repeating it (the error names the field)."""

    def check(v: object) -> object:
        if not isinstance(v, str) or _ENV_NAME.fullmatch(v.strip()):
            return v.strip() if isinstance(v, str) else v
        if "://" in v or "@" in v or ":" in v or has_control(v) or len(v) > 128:
            raise ConfigError(f"invalid spec: {field}: not an environment variable name but a URL or credential "
                              "(the value is not shown)", hint=_SECRET_FIX, field=field)
        raise ValueError(f"{v!r} is not an environment variable name: {_SECRET_FIX}")

    return BeforeValidator(check)


def _line(v: str | None) -> str | None:
    return no_control(v)


class _Block(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)


class WebhookTarget(_Block):
    url_secret: Annotated[str, secret_name("notify.webhook.url_secret")] = Field(
        ..., description="local environment variable holding the webhook URL (the URL is "
                            "a credential: it is never written to the spec, state or logs)")
    format: Literal["slack", "discord", "teams", "json"] = Field(
        "json", description="`slack`, `discord`, `teams` (the payload each service documents) or `json` "
        "(the event as it is)")


class EmailTarget(_Block):
    to: list[str] = Field(..., min_length=1, max_length=50, description="recipients")
    smtp_secret: Annotated[str, secret_name("notify.email.smtp_secret")] = Field(
        ..., description="local environment variable holding the SMTP URL "
                             "`smtp://user:password@host:port` (`smtps://` for TLS; `?starttls=1` to upgrade)")
    sender: str = Field("gtrain@localhost", description="the From address")

    @field_validator("to")
    @classmethod
    def _addresses(cls, v: list[str]) -> list[str]:
        for a in v:
            if not _EMAIL.match(a):
                raise ValueError(f"{a!r} is not an e-mail address (name@example.com)")
        return v

    @field_validator("sender")
    @classmethod
    def _sender(cls, v: str) -> str:
        if not _EMAIL.match(v) and not (v.endswith("@localhost") and _EMAIL.match(v + ".x")):
            raise ValueError(f"{v!r} is not an e-mail address (name@example.com; one line, no control characters)")
        return v


class NotifySpec(_Block):
    on: list[str] = Field(default_factory=lambda: list(DEFAULT_EVENTS),
                          description="events that send a message: " + ", ".join(f"`{e}`" for e in EVENTS))
    webhook: WebhookTarget | None = Field(None, description="`{url_secret, format}`")
    email: EmailTarget | None = Field(None, description="`{to: [...], smtp_secret, sender}`")
    command: str | None = Field(None, description="a local command run with the event as JSON on its stdin "
                                "(split like a shell command line, no shell)")

    @field_validator("on")
    @classmethod
    def _events(cls, v: list[str]) -> list[str]:
        for e in v:
            if e not in EVENTS:
                raise ValueError(f"{e!r} is not an event; pick from {', '.join(EVENTS)}")
        return list(dict.fromkeys(v))

    @field_validator("command")
    @classmethod
    def _command(cls, v: str | None) -> str | None:
        no_control(v)
        if v is not None:
            try:
                if not shlex.split(v):
                    raise ValueError("is empty; give a command, or leave `command` out")
            except ValueError as e:
                raise ValueError(f"{v!r} does not split like a command line ({e})") from None
        return v

    def targets(self) -> list[str]:
        return [n for n, t in (("webhook", self.webhook), ("email", self.email), ("command", self.command)) if t]


class EnergySpec(_Block):
    grid_gco2_per_kwh: float | None = Field(None, ge=0, le=2000, allow_inf_nan=False,
                                            description="grid carbon intensity (gCO2e/kWh) instead of the "
                                            "shipped table's figure for the region")
    grid_source: str | None = Field(None, max_length=200, description="where that figure comes from (shown "
                                    "beside the carbon estimate)")

    _one_line = field_validator("grid_source")(_line)


class WandbTracking(_Block):
    project: str = Field(..., min_length=1, max_length=128, description="W&B project (WANDB_PROJECT)")
    entity: str | None = Field(None, max_length=128, description="W&B entity (WANDB_ENTITY)")
    api_key_secret: Annotated[str, secret_name("job.tracking.wandb.api_key_secret")] = Field(
        "WANDB_API_KEY", description="local environment variable sent to the ranks "
                                "as WANDB_API_KEY (absent locally: offline runs still work)")
    mode: Literal["online", "offline"] | None = Field(None, description="WANDB_MODE")

    _one_line = field_validator("project", "entity")(_line)


class MlflowTracking(_Block):
    tracking_uri: str = Field(..., min_length=1, description="MLFLOW_TRACKING_URI (`http://host:5000`)")
    experiment: str = Field("Default", min_length=1, max_length=256, description="MLFLOW_EXPERIMENT_NAME")
    token_secret: Annotated[str | None, secret_name("job.tracking.mlflow.token_secret")] = Field(
        None, description="local environment variable sent as MLFLOW_TRACKING_TOKEN")

    @field_validator("tracking_uri")
    @classmethod
    def _uri(cls, v: str) -> str:
        if url_credentials(v):
            raise ConfigError("invalid spec: job.tracking.mlflow.tracking_uri: a password or token in the URL is "
                              "refused (the value is not shown); put it in job.secrets or name it in token_secret",
                              field="job.tracking.mlflow.tracking_uri",
                              hint="MLflow's token: name its local variable in token_secret (sent "
                              "as MLFLOW_TRACKING_TOKEN); other credentials: job.secrets")
        if not re.match(r"^(https?|file|sqlite|databricks)(://|:)", v):
            raise ValueError(f"{v!r}: give http(s)://host:port (a tracking server), file:/path or sqlite:///path")
        return no_control(v) or v

    _one_line = field_validator("experiment")(_line)


class Tracking(_Block):
    wandb: WandbTracking | None = Field(None, description="`{project, entity, api_key_secret, mode}`")
    mlflow: MlflowTracking | None = Field(None, description="`{tracking_uri, experiment, token_secret}`")
    forward_metrics: bool = Field(False, description="`gtrain.metrics.log` on rank 0 also logs to the "
                                  "configured trackers (MLflow's REST API; `wandb.log` when the script started a "
                                  "W&B run)")
    tensorboard: bool | str = Field(False, description="`true` or a folder (relative to the workdir, or absolute; "
                                    "`true` = `tensorboard`): `GTRAIN_TENSORBOARD_DIR` / `TENSORBOARD_LOGDIR` on "
                                    "every rank; the event files written there are kept in the run archive and read "
                                    "by `gtrain report`")

    @field_validator("tensorboard")
    @classmethod
    def _tb(cls, v: bool | str) -> bool | str:
        if isinstance(v, str) and (not v.strip() or has_control(v)):
            raise ValueError(f"{v!r}: give true, or the folder your SummaryWriter writes (relative to the workdir)")
        if isinstance(v, str) and ".." in v.split("/"):
            raise ValueError("may not hold '..'; give a folder inside the workdir (e.g. tensorboard) or an "
                             "absolute folder of the job's own")
        if isinstance(v, str) and v.startswith("/") and (sysdir := system_dir(v)):
            raise ValueError(f"is {'the root folder' if sysdir == '/' else 'in the system folder ' + sysdir}; "
                             "give a folder inside the workdir (e.g. tensorboard) or one of the job's own")
        return v

    @property
    def tensorboard_dir(self) -> str | None:
        """The folder the ranks' SummaryWriter writes (None: not asked for)."""
        if self.tensorboard is True:
            return "tensorboard"
        return self.tensorboard.strip() if isinstance(self.tensorboard, str) else None

    def secrets(self) -> list[str]:
        out = [self.wandb.api_key_secret] if self.wandb else []
        return out + ([self.mlflow.token_secret] if self.mlflow and self.mlflow.token_secret else [])

