"""The one block `pipeline up` prints once everything answers: where each part is, Flower's
credential, dev mode or not, and where the logs go."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# A server bound to every address is reached on this machine through loopback.
WILDCARDS = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}  # noqa: S104 - a name, not a bind


def http_url(host: str, port: int, path: str = "") -> str:
    """A URL a browser on this machine opens for a server listening on `host:port`."""
    shown = WILDCARDS.get(host, host)
    if ":" in shown:
        shown = f"[{shown}]"
    return f"http://{shown}:{port}{path}"


@dataclass(frozen=True, kw_only=True)
class Banner:
    """What the ready banner says."""

    intake_url: str
    flower_url: str
    # Flower's credential: a generated one is shown (once), a configured one is named.
    flower_user: str
    flower_password: str | None
    dev_mode: bool
    log_path: Path
    redis: str
    journal: str
    # Components that did not answer in time (the banner still comes, saying so).
    not_answering: tuple[str, ...] = ()

    def lines(self, *, show_secret: bool) -> list[str]:
        """The banner's lines; with `show_secret` false (for the log file) the generated
        password is left out."""
        if self.flower_password is None:
            credential = "user and password from PIPELINE_FLOWER_BASIC_AUTH"
        elif show_secret:
            credential = f"(user {self.flower_user}, password {self.flower_password}; shown once)"
        else:
            credential = f"(user {self.flower_user}, password shown on the terminal only)"
        if self.dev_mode:
            dev = (
                "on: unsigned requests from this machine only, admin endpoints open unless "
                "an admin token is set (set PIPELINE_INTAKE_KEYS to leave it)"
            )
        else:
            dev = "off: requests must be signed with a key of PIPELINE_INTAKE_KEYS"
        if self.not_answering:
            head = f"pipeline is up, but these did not answer yet: {', '.join(self.not_answering)}"
        else:
            head = "pipeline is up"
        return [
            f"==== {head} ====",
            f"intake     {self.intake_url}",
            f"console    {self.intake_url}/",
            f"API docs   {self.intake_url}/docs",
            f"Flower     {self.flower_url} {credential}",
            f"dev mode   {dev}",
            f"redis      {self.redis}",
            f"journal    {self.journal}",
            f"logs       this terminal, each line after its component's name; also {self.log_path}",
            "Ctrl-C stops everything.",
        ]
