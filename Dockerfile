# The agent image (built by `choirctl agent build ID`, never by hand): the
# Debian 12 base made from Debian packages by scripts/build-base-image.sh, plus
# the choir-agent binary and the agent's baked /choir (identity, tools, skills).
# choird assembles the build context, with every file owned by root and
# writable by nobody else, so /choir is read-only to the agent even before the
# container's root filesystem is mounted read-only.
ARG BASE=choir-base:bookworm
FROM ${BASE}
COPY choir-agent /usr/local/bin/choir-agent
COPY choir/ /choir/
ENV PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8
USER 10001:10001
WORKDIR /workspace
ENTRYPOINT ["/usr/local/bin/choir-agent"]
