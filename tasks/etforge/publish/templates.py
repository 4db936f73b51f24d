"""The one Jinja environment every template is rendered with (templates/), with every filter.

Autoescaping is on for HTML templates (``*.html.j2``: the report, where every
label is escaped) and off for the others (Dart, YAML, CMake, C++), whose
literals the filters of etforge.publish.literals escape. StrictUndefined: a
name a template uses and the context lacks is an error, not an empty string.
jinja2 is imported on first use, never while planning.
"""

from __future__ import annotations

from etforge.core.paths import TEMPLATE_DIR
from etforge.publish import literals

FILTERS = {
    "dart": literals.dart_string,
    "dart_double": literals.dart_double,
    "cmake": literals.cmake_string,
    "yaml": literals.yaml_string,
    "comment": literals.comment,
    "cstr": literals.c_string,
    "ccomment": literals.c_comment,
    "cdouble": literals.c_double,
}


def environment():
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
        undefined=jinja2.StrictUndefined,
        autoescape=jinja2.select_autoescape(enabled_extensions=("html.j2",), default_for_string=False, default=False),
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(FILTERS)
    return env


def render(template: str, **context) -> str:
    return environment().get_template(template).render(**context)
