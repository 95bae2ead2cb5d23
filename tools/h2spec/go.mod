// Wrapper module that builds h2spec, the HTTP/2 conformance tester scripts/h2spec.sh runs against
// the PS (tools/build-h2spec.sh). Its v2.3.0+ tags carry a go.mod without a /v2 suffix, which Go
// cannot select, and this machine's module proxy serves no pseudo-version of a later commit, so
// the pin is v2.2.1+incompatible (2019-02-12), with its dependencies at the revisions its own
// Gopkg.lock (and upstream's later go.mod) pins: golang.org/x/net 55a3084c9119 (2016-11) etc.
// Re-pin: GOWORK=off go get -tool github.com/summerwind/h2spec/cmd/h2spec@vX.Y.Z, then the
// dependencies to upstream's pins with go get, && go mod tidy.
module foresight/tools/h2spec

go 1.26.0

tool github.com/summerwind/h2spec/cmd/h2spec

require (
	github.com/fatih/color v0.0.0-20161025120501-bf82308e8c85 // indirect
	github.com/inconshreveable/mousetrap v1.0.0 // indirect
	github.com/mattn/go-colorable v0.1.0 // indirect
	github.com/mattn/go-isatty v0.0.4 // indirect
	github.com/spf13/cobra v0.0.0-20170118185516-dc208f4211e7 // indirect
	github.com/spf13/pflag v1.0.3 // indirect
	github.com/summerwind/h2spec v2.2.1+incompatible // indirect
	golang.org/x/net v0.0.0-20161104230106-55a3084c9119 // indirect
	golang.org/x/sys v0.0.0-20190209173611-3b5209105503 // indirect
)
