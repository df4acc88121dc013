# Sourced by demo.sh and test.sh: create .venv (Python >= 3.11) if missing and install
# schedsvc into it, editable, with the extras named in $1 (e.g. "[test]", or "" for none).
install_into_venv() {
    local py="${PYTHON:-python3}"
    if [ ! -x .venv/bin/python ]; then
        "$py" -m venv .venv
    fi
    .venv/bin/python -m pip install --quiet --upgrade pip
    .venv/bin/python -m pip install --quiet -e ".$1"
}
