"""What every doctor section is made of: findings with a status, and the
problems (failures) a run of sections adds up to."""

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Finding:
    name: str
    status: str  # "ok", "info", "warn" or "fail"
    message: str


@dataclass(frozen=True)
class Section:
    title: str
    findings: tuple[Finding, ...]
    data: dict = field(default_factory=dict)  # JSON-ready numbers behind the findings

    @property
    def failed(self) -> list[Finding]:
        return [f for f in self.findings if f.status == "fail"]

    def to_dict(self) -> dict:
        return {"title": self.title, "findings": [f.__dict__ for f in self.findings], "data": self.data}


def problems(sections: list[Section]) -> list[str]:
    return [f"{s.title.lower()}: {f.name}: {f.message}" for s in sections for f in s.failed]
