"""How the router watches its backends: their load and metrics, their health, and when a
failing one is ejected and let back."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from specroute.router.backends.health import Ejection

_EJECTION = Ejection()  # the breaker's defaults are its own


class HealthSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    poll_interval: float = Field(
        0.5, gt=0, description="seconds between readings of each backend's load and metrics"
    )
    stale_after: float = Field(
        2.0, gt=0, description="seconds after which a backend's last reading is not believed"
    )
    interval: float = Field(
        2.0,
        gt=0,
        description="seconds between health checks",
        json_schema_extra={"flat": "health_interval"},
    )
    timeout: float = Field(
        2.0,
        gt=0,
        description="seconds a health check may take before it counts as failed",
        json_schema_extra={"flat": "health_timeout"},
    )
    eject_after_failures: int = Field(
        _EJECTION.after_failures,
        ge=1,
        description="a backend's failures in a row (requests or health checks) that eject it",
    )
    eject_seconds: float = Field(
        _EJECTION.seconds,
        gt=0,
        description="an ejection's first cool-down; each ejection in a row adds as much",
    )
    eject_max_seconds: float = Field(
        _EJECTION.max_seconds, gt=0, description="the longest cool-down of an ejection"
    )
    readmit_after_successes: int = Field(
        _EJECTION.readmit_after_successes,
        ge=1,
        description="after the cool-down, successful trials in a row that readmit a backend",
    )

    @model_validator(mode="after")
    def _cool_downs(self) -> HealthSettings:
        if self.eject_max_seconds < self.eject_seconds:
            raise ValueError(
                f"eject_max_seconds ({self.eject_max_seconds:g}) must be at least "
                f"eject_seconds ({self.eject_seconds:g})"
            )
        return self

    def cautions(self) -> list[str]:
        """What these allow but a user most likely did not mean, in a sentence each."""
        if self.stale_after >= self.poll_interval:
            return []
        return [
            f"stale_after ({self.stale_after:g} s) is shorter than poll_interval "
            f"({self.poll_interval:g} s): a backend's reading goes stale before the next "
            "one comes, so /router/status and the policies see none most of the time; "
            f"set stale_after to at least {self.poll_interval:g} (a few polls, "
            f"{3 * self.poll_interval:g}, is usual) or poll more often"
        ]
