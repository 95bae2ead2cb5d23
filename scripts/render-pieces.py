#!/usr/bin/env python3
"""Draw docs/img/pieces.svg: the pieces of Foresight and what flows between them.

Standard library only; run `python3 scripts/render-pieces.py` from anywhere to regenerate the
picture that README.md and docs/architecture.md show. Edit the boxes and arrows below, not the SVG.
"""

from __future__ import annotations

import pathlib
import sys
from xml.sax.saxutils import escape

WIDTH, HEIGHT = 900, 420
OUT = pathlib.Path(__file__).resolve().parent.parent / "docs" / "img" / "pieces.svg"

# Fill colours by kind of piece: what the user writes, Foresight's processes, monitoring.
USER, FORESIGHT, MONITORING = "#fff4d6", "#dcecff", "#e3f5e1"
STROKE, TEXT, MUTED = "#33475b", "#1b2631", "#566573"


class Svg:
    def __init__(self) -> None:
        self.parts: list[str] = []

    def add(self, element: str) -> None:
        self.parts.append(element)

    def text(self, x: float, y: float, s: str, size: int = 13, weight: str = "normal",
             anchor: str = "middle", fill: str = TEXT, style: str = "normal") -> None:
        self.add(
            f'<text x="{x}" y="{y}" font-size="{size}" font-weight="{weight}" font-style="{style}" '
            f'text-anchor="{anchor}" fill="{fill}">{escape(s)}</text>'
        )

    def box(self, x: float, y: float, w: float, h: float, fill: str, title: str,
            lines: list[str], stacked: int = 0) -> None:
        """A rounded box with a bold title and smaller lines; `stacked` draws copies behind it
        (shards, worker pods: more than one of the same)."""
        for i in range(stacked, 0, -1):
            self.add(
                f'<rect x="{x + 6 * i}" y="{y - 6 * i}" width="{w}" height="{h}" rx="8" '
                f'fill="{fill}" stroke="{STROKE}" stroke-width="1.2"/>'
            )
        self.add(
            f'<rect x="{x}" y="{y}" width="{w}" height="{h}" rx="8" fill="{fill}" '
            f'stroke="{STROKE}" stroke-width="1.5"/>'
        )
        cx = x + w / 2
        self.text(cx, y + 22, title, size=15, weight="bold")
        for i, line in enumerate(lines):
            self.text(cx, y + 42 + 17 * i, line, size=12, fill=MUTED)

    def arrow(self, points: list[tuple[float, float]], dashed: bool = False,
              both: bool = False) -> None:
        path = " ".join(f"{x},{y}" for x, y in points)
        dash = ' stroke-dasharray="6 4"' if dashed else ""
        start = ' marker-start="url(#head)"' if both else ""
        self.add(
            f'<polyline points="{path}" fill="none" stroke="{STROKE}" stroke-width="1.6"{dash}'
            f'{start} marker-end="url(#head)"/>'
        )

    def render(self) -> str:
        head = (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
            f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="DejaVu Sans, Helvetica, Arial, sans-serif">\n'
            "<title>The pieces of Foresight</title>\n"
            "<defs><marker id=\"head\" viewBox=\"0 0 10 10\" refX=\"9\" refY=\"5\" markerWidth=\"8\" "
            "markerHeight=\"8\" orient=\"auto-start-reverse\">"
            f'<path d="M0,0 L10,5 L0,10 z" fill="{STROKE}"/></marker></defs>\n'
            f'<rect width="{WIDTH}" height="{HEIGHT}" fill="#ffffff"/>\n'
        )
        return head + "\n".join(self.parts) + "\n</svg>\n"


def draw() -> str:
    s = Svg()

    # The pieces.
    s.box(20, 150, 175, 85, USER, "TrainingJob", ["a YAML you apply:", "model, data, rule, workers"])
    s.box(255, 150, 185, 85, FORESIGHT, "operator", ["foresight operator:", "reconciles each job"])
    s.box(505, 40, 210, 95, FORESIGHT, "parameter server", ["N shards: a Deployment and", "Service each (foresight-ps);",
                                                            "model, update rules, checkpoints"], stacked=2)
    s.box(505, 290, 210, 85, FORESIGHT, "workers", ["M pods of an Indexed Job:", "foresight-worker or your script"],
          stacked=2)
    s.box(765, 105, 120, 65, MONITORING, "Prometheus", ["scrapes /metrics"])
    s.box(765, 290, 120, 65, MONITORING, "Grafana", ["the dashboard"])

    # TrainingJob ⇄ operator.
    s.arrow([(195, 180), (255, 180)])
    s.text(225, 173, "watch", size=11)
    s.arrow([(255, 207), (195, 207)])
    s.text(225, 224, "status", size=11)

    # The operator writes the children and reads the PS's progress.
    s.arrow([(440, 168), (505, 105)])
    s.text(466, 118, "creates;", size=11, anchor="end")
    s.text(466, 132, "reads /v1/status", size=11, anchor="end")
    s.arrow([(440, 220), (505, 320)])
    s.text(452, 292, "creates", size=11, anchor="start")

    # Workers and the PS shards: every step pushes each shard its slice and pulls it back.
    s.arrow([(560, 290), (560, 135)])
    s.arrow([(660, 135), (660, 290)])
    s.text(554, 205, "push", size=12, anchor="end", weight="bold")
    s.text(554, 221, "gradients", size=12, anchor="end")
    s.text(666, 205, "pull", size=12, anchor="start", weight="bold")
    s.text(666, 221, "the model", size=12, anchor="start")
    s.text(610, 200, "HTTP/2", size=11, fill=MUTED)
    s.text(610, 214, "safetensors", size=11, fill=MUTED)
    s.text(610, 228, "h2c or TLS", size=11, fill=MUTED)

    # Metrics: Prometheus scrapes the PS, the workers and the operator; Grafana reads it.
    s.arrow([(765, 130), (721, 100)], dashed=True)
    s.arrow([(765, 155), (721, 305)], dashed=True)
    s.arrow([(825, 105), (825, 18), (347, 18), (347, 150)], dashed=True)
    s.text(586, 13, "Prometheus scrapes /metrics of the PS, the workers and the operator", size=11,
           fill=MUTED)
    s.arrow([(825, 290), (825, 170)])
    s.text(832, 235, "queries", size=11, anchor="start")

    # What runs without Kubernetes.
    s.text(WIDTH / 2, 405, "foresight run job.yaml starts the same parameter server and worker processes "
           "on one machine, without Kubernetes.", size=12, style="italic", fill=MUTED)
    return s.render()


def main() -> int:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(draw())
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
