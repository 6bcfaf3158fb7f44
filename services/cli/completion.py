"""`accum completion bash`: shell completion for the commands and their options, built from
the parser itself, so it never lists a command that does not exist.

    source <(accum completion bash)               # this shell
    accum completion bash > ~/.local/share/bash-completion/completions/accum
    # zsh: autoload -U bashcompinit && bashcompinit && source <(accum completion bash)
"""

from __future__ import annotations

import argparse
from typing import Any

SCRIPT = """_accum() {{
    local cur=${{COMP_WORDS[COMP_CWORD]}}
    if [ "$COMP_CWORD" -eq 1 ]; then
        COMPREPLY=($(compgen -W "{commands}" -- "$cur"))
        return
    fi
    case ${{COMP_WORDS[1]}} in
{cases}
    esac
}}
complete -o default -F _accum accum
"""


def register(commands: Any) -> None:
    completion = commands.add_parser("completion", help="print a shell completion script")
    completion.add_argument("shell", choices=("bash",), help="bash (zsh: through bashcompinit)")
    # The subcommands object itself: by the time the command runs it holds every command.
    completion.set_defaults(func=cmd_completion, subcommands=commands)


def bash_script(subcommands: Any) -> str:
    """The completion script for the subcommands (argparse's `add_subparsers()` object) and
    each one's options."""
    cases = []
    for name, sub in subcommands.choices.items():
        words = [o for action in sub._actions for o in action.option_strings if o.startswith("--")]
        # Options only: a file or a job id is completed by the shell's default (-o default).
        cases.append(f'        {name}) COMPREPLY=($(compgen -W "{" ".join(words)}" -- "$cur")) ;;')
    return SCRIPT.format(commands=" ".join(subcommands.choices), cases="\n".join(cases))


def cmd_completion(args: argparse.Namespace) -> int:
    print(bash_script(args.subcommands), end="")
    return 0
