package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericiooptions"
)

// Streams are a command's standard input, output and error.
type Streams = genericiooptions.IOStreams

// ExitError ends a command with an exit code (ExitFailed, ExitUsage, or a
// command's own); what went wrong has been written already.
type ExitError struct{ Code int }

func (e ExitError) Error() string { return fmt.Sprintf("exit status %d", e.Code) }

// Exit is nil for ExitOK, else the ExitError of code: a command's RunE
// returns Exit(run(…)).
func Exit(code int) error {
	if code == ExitOK {
		return nil
	}
	return ExitError{Code: code}
}

// usageError is a command line cobra could not parse (an unknown flag, a
// flag without its value): exit 2, as every command's own usage errors.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }

// NewCommand is a verb's command with the conventions every verb shares:
// output to the streams, no usage dump on a failure (the verb says what
// went wrong in its words), exit 2 on a flag cobra cannot parse.
func NewCommand(s Streams, cmd *cobra.Command) *cobra.Command {
	cmd.SetIn(s.In)
	cmd.SetOut(s.Out)
	cmd.SetErr(s.ErrOut)
	cmd.SilenceErrors = true
	cmd.SilenceUsage = true
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	return cmd
}

// ExitCode runs cmd with args, writes what cobra found wrong (an unknown
// command or flag, a wrong number of arguments) to stderr, and returns the
// process exit code. A verb's own failures are ExitErrors, told already.
func ExitCode(cmd *cobra.Command, args []string, stderr io.Writer) int {
	cmd.SetArgs(LongFlags(cmd, args))
	c, err := cmd.ExecuteC()
	var exit ExitError
	switch {
	case err == nil:
		return ExitOK
	case errors.As(err, &exit):
		return exit.Code
	default:
		fmt.Fprintf(stderr, "%s: %v\nUsage: %s\nRun '%s --help' for more.\n", c.CommandPath(), err, c.UseLine(), c.CommandPath())
		return ExitUsage
	}
}

// LongFlags rewrites -word flags as --word where word is a flag of the
// command args run: earlier releases parsed flags with Go's flag package,
// which takes both, and scripts that wrote `-kubeconfig k` or `-dry-run`
// keep working. Anything else is left as kubectl reads it: shorthands with
// their values (-n shop, -nshop, -ojson), a flag's value that starts with a
// dash, and everything after "--".
func LongFlags(root *cobra.Command, args []string) []string {
	cmd, _, err := root.Find(args)
	if err != nil || cmd == nil {
		cmd = root
	}
	cmd.InitDefaultHelpFlag()
	flags := cmd.Flags()
	flags.AddFlagSet(cmd.InheritedFlags())
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return append(out, args[i:]...)
		}
		name, hasValue := "", false
		switch {
		case strings.HasPrefix(a, "--"):
			name, _, hasValue = strings.Cut(a[2:], "=")
		case strings.HasPrefix(a, "-") && len(a) > 2:
			n, _, v := strings.Cut(a[1:], "=")
			if f := flags.Lookup(n); f != nil && len(n) > 1 {
				a, name, hasValue = "-"+a, n, v
			}
		case strings.HasPrefix(a, "-") && len(a) == 2:
			if f := flags.ShorthandLookup(a[1:]); f != nil {
				name = f.Name
			}
		}
		out = append(out, a)
		// A flag that takes a value, given without "=": the next word is
		// its value, whatever it looks like.
		if f := flags.Lookup(name); f != nil && !hasValue && f.NoOptDefVal == "" && i+1 < len(args) {
			i++
			out = append(out, args[i])
		}
	}
	return out
}

// NamespacedName reads a command's one Deployment argument, as kubectl
// does: NAMESPACE/NAME, or NAME in the namespace of -n or the context.
func NamespacedName(args []string, c *Cluster) (ns, name string, err error) {
	if len(args) != 1 || args[0] == "" {
		return "", "", errors.New("give exactly one Deployment: NAMESPACE/NAME, or NAME with -n NAMESPACE")
	}
	if ns, name, ok := strings.Cut(args[0], "/"); ok {
		if ns == "" || name == "" || strings.Contains(name, "/") {
			return "", "", fmt.Errorf("%q is not NAMESPACE/NAME", args[0])
		}
		return ns, name, nil
	}
	ns, _, err = c.Namespace()
	if err != nil {
		return "", "", ConfigError{err}
	}
	return ns, args[0], nil
}

// ConfigError is a kubeconfig that cannot be read: a failure (exit 1), not
// a wrong command line.
type ConfigError struct{ Err error }

func (e ConfigError) Error() string { return e.Err.Error() }
func (e ConfigError) Unwrap() error { return e.Err }

// ArgsError reports err from reading a verb's arguments: a ConfigError as a
// failure, anything else as a wrong command line.
func ArgsError(cmd *cobra.Command, err error) error {
	var config ConfigError
	if errors.As(err, &config) {
		fmt.Fprintf(cmd.ErrOrStderr(), "%s: %v\n", cmd.CommandPath(), err)
		return Exit(ExitFailed)
	}
	return Usage(cmd, err.Error())
}

// Usage reports a wrong command line, in the command's words and with its
// usage line, and ends it with ExitUsage.
func Usage(cmd *cobra.Command, what string) error {
	fmt.Fprintf(cmd.ErrOrStderr(), "%s: %s\nUsage: %s\nRun '%s --help' for more.\n", cmd.CommandPath(), what, cmd.UseLine(), cmd.CommandPath())
	return Exit(ExitUsage)
}

// CompleteWords completes flag's values with words (an output format, a
// report kind).
func CompleteWords(cmd *cobra.Command, flag string, words ...string) {
	_ = cmd.RegisterFlagCompletionFunc(flag, cobra.FixedCompletions(words, cobra.ShellCompDirectiveNoFileComp))
}

// WriteJSON writes v as the indented JSON of -o json.
func WriteJSON(w io.Writer, v any) {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

// Run runs the command newCommand makes with args and the given streams,
// and returns its exit code: one verb as main runs it, for its tests.
func Run(newCommand func(Streams) *cobra.Command, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	return ExitCode(newCommand(Streams{In: stdin, Out: stdout, ErrOut: stderr}), args, stderr)
}
