# Sourced by demo.sh and test.sh: create .venv (Python >= 3.11) if missing and install
# schedsvc into it, editable, with the extras named in $1 (e.g. "[test]", or "" for none).
install_into_venv() {
    local py="${PYTHON:-python3}"
    if [ ! -x .venv/bin/python ]; then
        "$py" -m venv .venv
    fi
    .venv/bin/python -m pip install --quiet --upgrade pip
    # strict: a tree of links to the package's files, which mypy finds (it cannot see through the import
    # hook of setuptools' default editable install); a module added later needs this install again
    .venv/bin/python -m pip install --quiet -e ".$1" --config-settings editable_mode=strict
}
