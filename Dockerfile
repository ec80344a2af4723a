# syntax=docker/dockerfile:1
# Build: a static binary from the module, with the module cache mounted so a
# rebuild after a code change does not download again.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY cmd/ cmd/
COPY webhook/ webhook/
COPY policy/ policy/
COPY reconciler/ reconciler/
COPY certs/ certs/
# config/native is Go (the native policies the guard installs, embedded).
COPY config/ config/
ARG VERSION=dev
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=linux go build -trimpath \
      -ldflags "-s -w -X main.version=${VERSION}" \
      -o /out/deployguard ./cmd/deployguard

# Run: distroless static, non-root. The binary writes nothing to its root
# filesystem (certificates come from a mounted Secret, or from an emptyDir given
# as --cert-dir in self-managed mode), so readOnlyRootFilesystem works.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/deployguard /deployguard
USER 65532:65532
EXPOSE 9443 8080 8081
ENTRYPOINT ["/deployguard"]
CMD ["serve"]
