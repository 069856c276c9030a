#!/bin/sh
# The build steps of images/Dockerfile, in one place: every image's venv stage RUNs the venv and
# project steps, the shared runtime stage the user step.
#
#   sh build.sh venv EXTRAS PIP_ARGS...  builder stage, in /src holding pyproject.toml,
#                                        requirements.py and the constraints file: /opt/venv with
#                                        the dependencies of the optional group EXTRAS (a layer of
#                                        its own, so a code change reinstalls only the project)
#   sh build.sh project SOURCE           builder stage: the project at SOURCE (the build context)
#                                        into /opt/venv (no dependencies), then `pip check`
#   sh build.sh user                     final stage: the non-root user, uid/gid 65532 (numeric, so
#                                        the kubelet can verify runAsNonRoot without /etc/passwd)
#
# Behind a TLS-intercepting proxy pip trusts the CA bundle handed in as the BuildKit secret
# `pip-ca` (RUN --mount=type=secret,id=pip-ca): it is read from /run/secrets, never a layer.
set -eu
export PIP_DISABLE_PIP_VERSION_CHECK=1

pip_ca() {
    if [ -s /run/secrets/pip-ca ]; then export PIP_CERT=/run/secrets/pip-ca; fi
}

step="${1:?usage: build.sh venv EXTRAS PIP_ARGS... | project SOURCE | user}"
shift
case "$step" in
    venv)
        extras="${1:?build.sh venv: EXTRAS (an optional-dependency group of pyproject.toml) is missing}"
        shift
        pip_ca
        python3 requirements.py pyproject.toml "$extras" > /tmp/requirements.txt
        python3 -m venv /opt/venv
        /opt/venv/bin/pip install "$@" -r /tmp/requirements.txt
        ;;
    project)
        source="${1:?build.sh project: SOURCE (the folder holding pyproject.toml) is missing}"
        pip_ca
        /opt/venv/bin/pip install --no-deps "$source"
        /opt/venv/bin/pip check
        ;;
    user)
        groupadd --system --gid 65532 elastic
        useradd --system --uid 65532 --gid 65532 --home-dir /home/elastic --create-home \
            --shell /usr/sbin/nologin elastic
        ;;
    *)
        echo "build.sh: unknown step '$step' (venv, project or user)" >&2
        exit 2
        ;;
esac
