// Package kubernetes checks the manifests in base/ and node-local/: it
// renders them with kustomize as `kubectl kustomize` would, decodes every
// object strictly into the Kubernetes API types (an unknown or misspelt
// field fails, as the API server's strict field validation would) and
// asserts the rules the cluster needs to form and serve (docs/kubernetes.md).
// It is a module of its own so the product's go.mod stays free of the
// Kubernetes API. No cluster is reachable here: this is what can be checked
// without one.
package kubernetes

import (
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// objects is one rendering, decoded.
type objects struct {
	sts      []*appsv1.StatefulSet
	services []*corev1.Service
	pdbs     []*policyv1.PodDisruptionBudget
	policies []*networkingv1.NetworkPolicy
	secrets  []*corev1.Secret
}

// render runs kustomize on dir (base or node-local) over an in-memory copy
// of this directory, with made-up secrets in place of the git-ignored
// secrets/ (a developer's real ones are never read).
func render(t *testing.T, dir string) []byte {
	t.Helper()
	return renderAt(t, "/k", "/k/"+dir, nil)
}

// renderAt is render with this directory copied to root in the in-memory
// file system, extra files (path → contents) added, and dir rendered.
func renderAt(t *testing.T, root, dir string, extra map[string]string) []byte {
	t.Helper()
	mem := filesys.MakeFsInMemory()
	err := filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if d.Name() == "secrets" {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".yaml") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return mem.WriteFile(path.Join(root, filepath.ToSlash(p)), b)
	})
	if err != nil {
		t.Fatal(err)
	}
	for name, v := range map[string]string{"token": "test-token", "cluster.key": "0123456789abcdef0123456789abcdef"} {
		if err := mem.WriteFile(root+"/base/secrets/"+name, []byte(v)); err != nil {
			t.Fatal(err)
		}
	}
	for p, v := range extra {
		if err := mem.WriteFile(p, []byte(v)); err != nil {
			t.Fatal(err)
		}
	}
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(mem, dir)
	if err != nil {
		t.Fatalf("kustomize %s: %v", dir, err)
	}
	out, err := m.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// decode splits a rendering into its documents and decodes each strictly
// into the type its apiVersion and kind name.
func decode(rendered []byte) (*objects, error) {
	o := &objects{}
	for doc := range strings.SplitSeq(string(rendered), "\n---\n") {
		if strings.TrimSpace(doc) == "" {
			continue
		}
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
			return nil, err
		}
		var err error
		switch head.APIVersion + " " + head.Kind {
		case "apps/v1 StatefulSet":
			err = strictInto(&o.sts, doc)
		case "v1 Service":
			err = strictInto(&o.services, doc)
		case "policy/v1 PodDisruptionBudget":
			err = strictInto(&o.pdbs, doc)
		case "networking.k8s.io/v1 NetworkPolicy":
			err = strictInto(&o.policies, doc)
		case "v1 Secret":
			err = strictInto(&o.secrets, doc)
		default:
			return nil, fmt.Errorf("unexpected object %s %s: add its type and rules to the test", head.APIVersion, head.Kind)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", head.Kind, err)
		}
	}
	return o, nil
}

// strictInto decodes doc into a new T, refusing unknown and duplicate
// fields, and appends it to list.
func strictInto[T any](list *[]*T, doc string) error {
	v := new(T)
	if err := yaml.UnmarshalStrict([]byte(doc), v); err != nil {
		return err
	}
	*list = append(*list, v)
	return nil
}

func TestBase(t *testing.T) {
	o, err := decode(render(t, "base"))
	if err != nil {
		t.Fatal(err)
	}
	for _, err := range append(append(o.rules(), o.names()...), o.partOf()...) {
		t.Error(err)
	}
	if len(o.services) != 2 || len(o.sts) != 1 || len(o.pdbs) != 1 || len(o.policies) != 1 || len(o.secrets) != 1 {
		t.Errorf("base renders %d StatefulSets, %d Services, %d PDBs, %d NetworkPolicies, %d Secrets; want 1, 2, 1, 1, 1",
			len(o.sts), len(o.services), len(o.pdbs), len(o.policies), len(o.secrets))
	}
}

func TestNodeLocalOverlay(t *testing.T) {
	o, err := decode(render(t, "node-local"))
	if err != nil {
		t.Fatal(err)
	}
	// The base's labels reach only the base's objects: the overlay's
	// Service must carry part-of itself (issue 47), or
	// `kubectl get all -l app.kubernetes.io/part-of=stallfree` misses it.
	for _, err := range o.partOf() {
		t.Error(err)
	}
	// The base's rules hold in the overlay too.
	for _, err := range append(o.rules(), o.names()...) {
		t.Error(err)
	}
	for _, err := range o.nodeLocalRules() {
		t.Error(err)
	}
}

// docs/kubernetes.md names the image with kubectl alone (issue 47: not
// `kustomize edit`): an overlay of the user's own, written by the heredoc
// the docs show, at the repository root. The overlay is taken from the docs
// as written and rendered the way `kubectl apply -k` would.
func TestImageOverlayAsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/kubernetes.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "cat > my-stallfree/kustomization.yaml <<'EOF'\n")
	body, _, ok2 := strings.Cut(rest, "   EOF\n")
	if !ok || !ok2 {
		t.Fatal("docs/kubernetes.md: no `cat > my-stallfree/kustomization.yaml <<'EOF'` block")
	}
	var yaml strings.Builder
	for line := range strings.Lines(body) {
		yaml.WriteString(strings.TrimPrefix(line, "   ")) // the block's indent in the numbered list
	}
	out := renderAt(t, "/repo/deploy/kubernetes", "/repo/my-stallfree",
		map[string]string{"/repo/my-stallfree/kustomization.yaml": yaml.String()})
	o, err := decode(out)
	if err != nil {
		t.Fatal(err)
	}
	if c := o.container(); c == nil || c.Image != "registry.example.com/stallfree:v1" {
		t.Fatalf("the documented overlay renders image %v; want registry.example.com/stallfree:v1", c)
	}
}

// cachenode ignores a STALLFREE_ variable that names no flag (the
// environment holds many), so a misspelt one would pass unnoticed in a
// pod: every variable and argument the manifests set must name a flag that
// cmd/cachenode defines.
func TestEveryFlagIsCachenodes(t *testing.T) {
	defined := cachenodeFlags(t)
	for _, dir := range []string{"base", "node-local"} {
		o, err := decode(render(t, dir))
		if err != nil {
			t.Fatal(err)
		}
		for flag := range flags(o.container()) {
			if !defined[flag] {
				t.Errorf("%s: --%s (or STALLFREE_%s) is no flag of cachenode", dir, flag, strings.ToUpper(strings.ReplaceAll(flag, "-", "_")))
			}
		}
	}
	if defined["no-such-flag"] || !defined["bootstrap-ordinal-zero"] || !defined["socket"] {
		t.Fatalf("reading cachenode's flags went wrong: %v", defined)
	}
}

// cachenodeFlags reads the flag names cmd/cachenode defines from its
// source (fs.String("name", ...), fs.Var(&v, "name", ...)): this module
// cannot import a command of another.
func cachenodeFlags(t *testing.T) map[string]bool {
	t.Helper()
	files, err := filepath.Glob("../../cmd/cachenode/*.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("cmd/cachenode sources: %v", err)
	}
	def := regexp.MustCompile(`fs\.(?:String|Bool|Duration|Int|Int64|Uint|Uint64|Float64|Var)\((?:&\w+, )?"([a-z0-9-]+)"`)
	out := map[string]bool{}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range def.FindAllSubmatch(b, -1) {
			out[string(m[1])] = true
		}
	}
	return out
}

// The checks can fail: a misspelt field is refused by the strict decoding,
// and each broken rule below is reported.
func TestChecksCatchBrokenManifests(t *testing.T) {
	good := render(t, "base")
	typo := strings.Replace(string(good), "publishNotReadyAddresses:", "publishNotReadyAdresses:", 1)
	if _, err := decode([]byte(typo)); err == nil || !strings.Contains(err.Error(), "publishNotReadyAdresses") {
		t.Errorf("a misspelt field decoded: %v", err)
	}
	for _, c := range []struct {
		want   string
		mutate func(o *objects)
	}{
		{"podManagementPolicy", func(o *objects) { o.sts[0].Spec.PodManagementPolicy = appsv1.OrderedReadyPodManagement }},
		{"serviceName", func(o *objects) { o.sts[0].Spec.ServiceName = "stallfree" }},
		{"readiness", func(o *objects) { o.container().ReadinessProbe.HTTPGet.Path = "/healthz" }},
		{"liveness", func(o *objects) { o.container().LivenessProbe = nil }},
		{"anti-affinity", func(o *objects) { o.sts[0].Spec.Template.Spec.Affinity = nil }},
		{"gossip", func(o *objects) { o.headless().Spec.Ports[3].Port = 7947 }},
		{"--join", func(o *objects) { setEnv(o.container(), "STALLFREE_JOIN", "stallfree:7946") }},
		{"--token-file", func(o *objects) { setEnv(o.container(), "STALLFREE_TOKEN_FILE", "/etc/token") }},
		{"--memory", func(o *objects) { setEnv(o.container(), "STALLFREE_MEMORY", "6GiB") }},
		{"publishNotReadyAddresses", func(o *objects) { o.headless().Spec.PublishNotReadyAddresses = false }},
		{"PodDisruptionBudget", func(o *objects) { v := intstr.FromInt32(2); o.pdbs[0].Spec.MaxUnavailable = &v }},
		{"NetworkPolicy", func(o *objects) { o.policies[0].Spec.Ingress[0].From[0].PodSelector = &metav1.LabelSelector{} }},
		{"preStop", func(o *objects) { o.container().Lifecycle = nil }},
		{"replicas", func(o *objects) { r := int32(1); o.sts[0].Spec.Replicas = &r }},
		{"terminationGracePeriodSeconds", func(o *objects) { g := int64(5); o.sts[0].Spec.Template.Spec.TerminationGracePeriodSeconds = &g }},
		{"bootstrap", func(o *objects) { o.container().Args = append(o.container().Args, "--bootstrap") }},
		{"--advertise", func(o *objects) {
			o.container().Env = slices.DeleteFunc(o.container().Env, isEnv("STALLFREE_ADVERTISE"))
		}},
		{"--name", func(o *objects) { setEnv(o.container(), "STALLFREE_NAME", "stallfree-0") }},
		{"--data-dir", func(o *objects) { o.container().Args[4] = "--data-dir=/tmp/state" }},
		{"--http", func(o *objects) { o.container().Args[0] = "--http=0.0.0.0:8080" }},
		{"--cluster-key-file", func(o *objects) {
			o.secrets[0].Data["cluster-key"] = o.secrets[0].Data["cluster.key"]
			delete(o.secrets[0].Data, "cluster.key")
		}},
		{"Service stallfree port http", func(o *objects) { o.services[1].Spec.Ports[0].TargetPort = intstr.FromString("peer") }},
		{`Service port name "gossip-udp-ports"`, func(o *objects) { o.headless().Spec.Ports[4].Name = "gossip-udp-ports" }},
	} {
		o, err := decode(good)
		if err != nil {
			t.Fatal(err)
		}
		c.mutate(o)
		errs := append(o.rules(), o.names()...)
		if !slices.ContainsFunc(errs, func(e error) bool { return strings.Contains(e.Error(), c.want) }) {
			t.Errorf("breaking %s went unnoticed (reported: %v)", c.want, errs)
		}
	}
}

// The overlay's own rules fail too when what they are about is broken.
func TestChecksCatchBrokenNodeLocalOverlay(t *testing.T) {
	good := render(t, "node-local")
	for _, c := range []struct {
		want   string
		mutate func(o *objects)
	}{
		{"published on the host", func(o *objects) { o.container().Ports[0].HostPort = 0 }},
		{"internalTrafficPolicy Local", func(o *objects) {
			o.services = slices.DeleteFunc(o.services, func(s *corev1.Service) bool { return s.Name == "stallfree-local" })
		}},
		{"--socket", func(o *objects) { setEnv(o.container(), "STALLFREE_SOCKET", "/tmp/stallfree.sock") }},
		{"same path", func(o *objects) { o.sts[0].Spec.Template.Spec.Volumes[0].HostPath.Path = "/var/run/sf" }},
		{"drop every capability", func(o *objects) { o.container().SecurityContext.Capabilities.Drop = nil }},
	} {
		o, err := decode(good)
		if err != nil {
			t.Fatal(err)
		}
		c.mutate(o)
		errs := o.nodeLocalRules()
		if !slices.ContainsFunc(errs, func(e error) bool { return strings.Contains(e.Error(), c.want) }) {
			t.Errorf("breaking %q went unnoticed (reported: %v)", c.want, errs)
		}
	}
}

func isEnv(name string) func(corev1.EnvVar) bool {
	return func(e corev1.EnvVar) bool { return e.Name == name }
}

func setEnv(c *corev1.Container, name, value string) {
	for i := range c.Env {
		if c.Env[i].Name == name {
			c.Env[i] = corev1.EnvVar{Name: name, Value: value}
		}
	}
}

func (o *objects) container() *corev1.Container {
	for i := range o.sts[0].Spec.Template.Spec.Containers {
		if c := &o.sts[0].Spec.Template.Spec.Containers[i]; c.Name == "cachenode" {
			return c
		}
	}
	return nil
}

func (o *objects) headless() *corev1.Service {
	for _, s := range o.services {
		if s.Spec.ClusterIP == corev1.ClusterIPNone {
			return s
		}
	}
	return nil
}

// flags are cachenode's flags as the container sets them: the environment
// (STALLFREE_<FLAG>), overridden by the arguments, as cachenode reads them.
// A value from the downward API reads "fieldRef:<path>".
func flags(c *corev1.Container) map[string]string {
	f := map[string]string{}
	for _, e := range c.Env {
		name, ok := strings.CutPrefix(e.Name, "STALLFREE_")
		if !ok {
			continue
		}
		name = strings.ToLower(strings.ReplaceAll(name, "_", "-"))
		switch {
		case e.ValueFrom != nil && e.ValueFrom.FieldRef != nil:
			f[name] = "fieldRef:" + e.ValueFrom.FieldRef.FieldPath
		default:
			f[name] = e.Value
		}
	}
	args := append(slices.Clone(c.Command), c.Args...)
	for i := 0; i < len(args); i++ {
		a, ok := strings.CutPrefix(args[i], "--")
		if !ok {
			continue
		}
		if k, v, ok := strings.Cut(a, "="); ok {
			f[k] = v
		} else if i+1 < len(args) && !strings.HasPrefix(args[i+1], "--") {
			f[a] = args[i+1]
			i++
		} else {
			f[a] = "true"
		}
	}
	return f
}

// port finds a container port by name.
func port(c *corev1.Container, name string) (corev1.ContainerPort, bool) {
	i := slices.IndexFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == name })
	if i < 0 {
		return corev1.ContainerPort{}, false
	}
	return c.Ports[i], true
}

// listenPort is the port of a host:port flag value.
func listenPort(v string) string { return v[strings.LastIndexByte(v, ':')+1:] }

// iecSize reads a cachenode size ("4GiB", "512MiB") as a quantity.
func iecSize(v string) (resource.Quantity, error) {
	return resource.ParseQuantity(strings.TrimSuffix(v, "B"))
}

func selects(sel map[string]string, podLabels map[string]string) bool {
	return len(sel) > 0 && labels.SelectorFromSet(sel).Matches(labels.Set(podLabels))
}

// rules are what the cluster needs, checked on one rendering; each broken
// rule is one error naming what it is about.
// partOf lists the objects without the app.kubernetes.io/part-of=stallfree
// label every object of the deployment carries.
func (o *objects) partOf() []error {
	var errs []error
	check := func(kind string, m metav1.ObjectMeta) {
		if m.Labels["app.kubernetes.io/part-of"] != "stallfree" {
			errs = append(errs, fmt.Errorf("%s %s: no label app.kubernetes.io/part-of=stallfree", kind, m.Name))
		}
	}
	for _, x := range o.sts {
		check("StatefulSet", x.ObjectMeta)
	}
	for _, x := range o.services {
		check("Service", x.ObjectMeta)
	}
	for _, x := range o.pdbs {
		check("PodDisruptionBudget", x.ObjectMeta)
	}
	for _, x := range o.policies {
		check("NetworkPolicy", x.ObjectMeta)
	}
	for _, x := range o.secrets {
		check("Secret", x.ObjectMeta)
	}
	return errs
}

func (o *objects) rules() []error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	if len(o.sts) != 1 {
		return []error{fmt.Errorf("%d StatefulSets, want 1", len(o.sts))}
	}
	sts := o.sts[0]
	spec := sts.Spec.Template.Spec
	podLabels := sts.Spec.Template.Labels
	if sts.Spec.Selector == nil || !selects(sts.Spec.Selector.MatchLabels, podLabels) {
		bad("StatefulSet: its selector does not match its pods")
	}
	// Three raft voters survive one pod down (the PDB's one); a lone node
	// with --join is never ready (it waits to see another member).
	if r := sts.Spec.Replicas; r == nil || *r < 3 {
		bad("StatefulSet: replicas under 3: raft would not survive the one pod the PDB lets go")
	}
	if sts.Spec.PodManagementPolicy != appsv1.ParallelPodManagement {
		bad("StatefulSet: podManagementPolicy %q, want Parallel (pods find each other before any is ready)", sts.Spec.PodManagementPolicy)
	}
	c := o.container()
	if c == nil {
		return append(errs, fmt.Errorf("StatefulSet: no container named cachenode"))
	}
	repo := c.Image
	if i := strings.LastIndexByte(repo, ':'); i > strings.LastIndexByte(repo, '/') {
		repo = repo[:i] // the tag
	}
	if repo != "stallfree" && !strings.HasSuffix(repo, "/stallfree") {
		bad("image %q: want the image deploy/Dockerfile builds (stallfree:local, or pushed as REGISTRY/stallfree)", c.Image)
	}
	f := flags(c)
	seen := map[string]bool{}
	for _, p := range c.Ports {
		k := fmt.Sprintf("%d/%s", p.ContainerPort, p.Protocol)
		if seen[k] || seen[p.Name] {
			bad("container port %s (%s) is listed twice (an overlay patch that did not merge?)", k, p.Name)
		}
		seen[k], seen[p.Name] = true, true
	}

	// One pod per host.
	aff := spec.Affinity
	if aff == nil || aff.PodAntiAffinity == nil || !slices.ContainsFunc(aff.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution,
		func(term corev1.PodAffinityTerm) bool {
			return term.TopologyKey == "kubernetes.io/hostname" && term.LabelSelector != nil && selects(term.LabelSelector.MatchLabels, podLabels)
		}) {
		bad("StatefulSet: no required pod anti-affinity on kubernetes.io/hostname selecting its own pods")
	}

	// Probes on the HTTP port.
	probe := func(what string, p *corev1.Probe, path string) {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != path || p.HTTPGet.Port != intstr.FromString("http") {
			bad("%s probe: want GET %s on the port named http", what, path)
		}
	}
	probe("readiness", c.ReadinessProbe, "/readyz")
	probe("liveness", c.LivenessProbe, "/healthz")
	if c.StartupProbe != nil {
		probe("startup", c.StartupProbe, "/healthz")
	}
	// The image has no shell: only the kubelet's own sleep can pause.
	if c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Sleep == nil || c.Lifecycle.PreStop.Exec != nil {
		bad("preStop: want the kubelet's sleep action (the image has no shell for exec)")
	} else if g := spec.TerminationGracePeriodSeconds; g == nil || *g < c.Lifecycle.PreStop.Sleep.Seconds+10+5 {
		bad("terminationGracePeriodSeconds: want at least the preStop sleep + 10 s HTTP drain + 5 s to leave gossip and close raft")
	}

	// Identity and discovery.
	if f["name"] != "fieldRef:metadata.name" {
		bad("--name %q: want the pod name (downward API metadata.name)", f["name"])
	}
	if f["advertise"] != "fieldRef:status.podIP" {
		bad("--advertise %q: want the pod IP (downward API status.podIP)", f["advertise"])
	}
	if f["bootstrap-ordinal-zero"] != "true" || f["bootstrap"] != "" {
		bad("bootstrap: want --bootstrap-ordinal-zero (ordinal 0 bootstraps an empty data dir) and no --bootstrap")
	}

	// Ports: flags, container and Services agree.
	want := map[string]string{"http": "http", "peer": "peer", "raft": "raft", "gossip": "gossip-tcp"}
	for flag, name := range want {
		p, ok := port(c, name)
		if !ok || fmt.Sprint(p.ContainerPort) != listenPort(f[flag]) || p.Protocol != corev1.ProtocolTCP {
			bad("--%s %q: no TCP container port %s on it", flag, f[flag], name)
		}
	}
	if p, ok := port(c, "gossip-udp"); !ok || fmt.Sprint(p.ContainerPort) != listenPort(f["gossip"]) || p.Protocol != corev1.ProtocolUDP {
		bad("--gossip %q: no UDP container port gossip-udp on it (memberlist uses both)", f["gossip"])
	}
	hl := o.headless()
	if hl == nil {
		bad("no headless Service (clusterIP: None)")
		return errs
	}
	if sts.Spec.ServiceName != hl.Name {
		bad("StatefulSet serviceName %q: want the headless Service %q", sts.Spec.ServiceName, hl.Name)
	}
	if !hl.Spec.PublishNotReadyAddresses {
		bad("headless Service: publishNotReadyAddresses false: pods could not find each other before one is ready")
	}
	for _, s := range o.services {
		if !selects(s.Spec.Selector, podLabels) {
			bad("Service %s: its selector does not match the cache's pods", s.Name)
		}
		for _, sp := range s.Spec.Ports {
			cp, ok := port(c, sp.TargetPort.String())
			if !ok || cp.Protocol != sp.Protocol || cp.ContainerPort != sp.Port {
				bad("Service %s port %s (%d/%s): targets %q, which is no container port of the same number and protocol", s.Name, sp.Name, sp.Port, sp.Protocol, sp.TargetPort.String())
			}
		}
	}
	for _, name := range []string{"http", "peer", "raft", "gossip-tcp", "gossip-udp"} {
		if !slices.ContainsFunc(hl.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == name }) {
			bad("headless Service: no port named %s", name)
		}
	}
	if f["join"] != hl.Name+":"+listenPort(f["gossip"]) {
		bad("--join %q: want the headless Service's name and the gossip port, %s:%s", f["join"], hl.Name, listenPort(f["gossip"]))
	}
	clients := 0
	for _, s := range o.services {
		if s.Spec.ClusterIP != corev1.ClusterIPNone && s.Spec.InternalTrafficPolicy == nil && len(s.Spec.Ports) == 1 && s.Spec.Ports[0].Name == "http" {
			clients++
		}
	}
	if clients != 1 {
		bad("want one client Service exposing only the port named http, found %d", clients)
	}

	// Memory: the limit is above --memory by the node's overheads.
	errs = append(errs, memoryRule(c, f)...)

	// Volumes: data dir and secrets where the flags point.
	mount := func(dir string) (corev1.VolumeMount, bool) {
		i := slices.IndexFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return path.Clean(m.MountPath) == path.Clean(dir) })
		if i < 0 {
			return corev1.VolumeMount{}, false
		}
		return c.VolumeMounts[i], true
	}
	if m, ok := mount(f["data-dir"]); !ok || !slices.ContainsFunc(sts.Spec.VolumeClaimTemplates, func(p corev1.PersistentVolumeClaim) bool { return p.Name == m.Name }) {
		bad("--data-dir %q: not a mounted volume claim (raft's state must survive restarts)", f["data-dir"])
	}
	for _, flag := range []string{"token-file", "cluster-key-file"} {
		dir, file := path.Split(f[flag])
		m, ok := mount(dir)
		i := slices.IndexFunc(spec.Volumes, func(v corev1.Volume) bool { return ok && v.Name == m.Name && v.Secret != nil })
		if f[flag] == "" || i < 0 {
			bad("--%s %q: not in a mounted Secret", flag, f[flag])
			continue
		}
		sec := spec.Volumes[i].Secret
		j := slices.IndexFunc(o.secrets, func(s *corev1.Secret) bool { return s.Name == sec.SecretName })
		if j < 0 {
			bad("--%s: Secret %q is not among the rendered ones (generated names carry a hash)", flag, sec.SecretName)
		} else if _, has := o.secrets[j].Data[file]; !has {
			bad("--%s: Secret %s has no key %q", flag, sec.SecretName, file)
		}
	}

	// At most one pod down at a time.
	if len(o.pdbs) != 1 {
		bad("%d PodDisruptionBudgets, want 1", len(o.pdbs))
	} else if p := o.pdbs[0]; p.Spec.MaxUnavailable == nil || p.Spec.MaxUnavailable.String() != "1" || p.Spec.MinAvailable != nil ||
		p.Spec.Selector == nil || !selects(p.Spec.Selector.MatchLabels, podLabels) {
		bad("PodDisruptionBudget: want maxUnavailable 1 over the cache's pods")
	}
	errs = append(errs, o.policyRules(podLabels, f)...)
	return errs
}

// memoryRule: requests equal limits (the cache is sized to them) and the
// limit leaves room above --memory for item overhead (RSS ≤ 1.15x the bytes
// cached, the goals in BENCHMARKS.md), the Go heap's headroom (cmd/cachenode's HeapHeadroom:
// 128 MiB + 1/32) and 256 MiB of manifests and runtime.
func memoryRule(c *corev1.Container, f map[string]string) []error {
	mem, err := iecSize(f["memory"])
	if err != nil {
		return []error{fmt.Errorf("--memory %q: %v", f["memory"], err)}
	}
	limit, ok := c.Resources.Limits[corev1.ResourceMemory]
	req := c.Resources.Requests[corev1.ResourceMemory]
	if !ok || req.Cmp(limit) != 0 {
		return []error{fmt.Errorf("memory: want a limit, and the request equal to it")}
	}
	m := mem.Value()
	need := m + m*15/100 + 128<<20 + m/32 + 256<<20
	if limit.Value() < need {
		return []error{fmt.Errorf("--memory %s: the limit %s leaves too little above it (want at least %d MiB)", f["memory"], limit.String(), need>>20)}
	}
	if _, ok := c.Resources.Requests[corev1.ResourceCPU]; !ok {
		return []error{fmt.Errorf("resources: no CPU request")}
	}
	return nil
}

// policyRules: peer, raft and gossip only from the cache's own pods; HTTP
// from every pod of the namespace.
func (o *objects) policyRules(podLabels map[string]string, f map[string]string) []error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf("NetworkPolicy: "+format, a...)) }
	if len(o.policies) != 1 {
		return []error{fmt.Errorf("%d NetworkPolicies, want 1", len(o.policies))}
	}
	np := o.policies[0]
	if !selects(np.Spec.PodSelector.MatchLabels, podLabels) || !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) {
		bad("want an Ingress policy over the cache's pods")
	}
	type portProto struct {
		port  string
		proto corev1.Protocol
	}
	internal := []portProto{{listenPort(f["peer"]), "TCP"}, {listenPort(f["raft"]), "TCP"}, {listenPort(f["gossip"]), "TCP"}, {listenPort(f["gossip"]), "UDP"}}
	httpPort := portProto{listenPort(f["http"]), "TCP"}
	opened := map[portProto]bool{}
	c := o.container()
	for _, rule := range np.Spec.Ingress {
		// ownOnly: every source is a selector of the cache's own pods (in
		// this namespace); namespace: some source is every pod of it.
		ownOnly, namespace := len(rule.From) > 0, false
		for _, from := range rule.From {
			podsHere := from.NamespaceSelector == nil && from.IPBlock == nil && from.PodSelector != nil
			all := podsHere && len(from.PodSelector.MatchLabels) == 0 && len(from.PodSelector.MatchExpressions) == 0
			own := podsHere && !all && len(from.PodSelector.MatchExpressions) == 0 && selects(from.PodSelector.MatchLabels, podLabels)
			ownOnly = ownOnly && own
			namespace = namespace || all
		}
		if len(rule.Ports) == 0 && !ownOnly {
			bad("a rule opens every port beyond the cache's pods")
		}
		for _, p := range rule.Ports {
			proto := corev1.ProtocolTCP
			if p.Protocol != nil {
				proto = *p.Protocol
			}
			num := p.Port.String()
			if p.Port != nil && p.Port.Type == intstr.String && c != nil {
				if cp, ok := port(c, p.Port.StrVal); ok {
					num = fmt.Sprint(cp.ContainerPort)
				}
			}
			pp := portProto{num, proto}
			switch {
			case slices.Contains(internal, pp) && !ownOnly:
				bad("port %s/%s (peer, raft or gossip) is open beyond the cache's own pods", pp.port, pp.proto)
			case slices.Contains(internal, pp):
				opened[pp] = true
			case pp == httpPort && namespace:
				opened[pp] = true
			}
		}
	}
	for _, pp := range append(internal, httpPort) {
		if !opened[pp] {
			bad("port %s/%s is not opened to those who need it (peer, raft, gossip: the cache's pods; HTTP: the namespace)", pp.port, pp.proto)
		}
	}
	return errs
}

// names checks what the API server's validation would refuse and strict
// decoding cannot see: object names (Services are DNS labels, since they
// become host names), port names (at most 15 characters), port numbers,
// label keys and values, environment variable names, Secret keys.
func (o *objects) names() []error {
	var errs []error
	check := func(what, value string, problems []string) {
		for _, p := range problems {
			errs = append(errs, fmt.Errorf("%s %q: %s", what, value, p))
		}
	}
	labelSet := func(what string, m map[string]string) {
		for k, v := range m {
			check(what+" label key", k, validation.IsQualifiedName(k))
			check(what+" label value", v, validation.IsValidLabelValue(v))
		}
	}
	for _, s := range o.services {
		check("Service name", s.Name, validation.IsDNS1035Label(s.Name))
		labelSet("Service "+s.Name, s.Labels)
		for _, p := range s.Spec.Ports {
			check("Service port name", p.Name, validation.IsValidPortName(p.Name))
			check("Service port", fmt.Sprint(p.Port), validation.IsValidPortNum(int(p.Port)))
		}
	}
	for _, sts := range o.sts {
		check("StatefulSet name", sts.Name, validation.IsDNS1123Subdomain(sts.Name))
		labelSet("pod", sts.Spec.Template.Labels)
		for _, c := range sts.Spec.Template.Spec.Containers {
			for _, p := range c.Ports {
				check("container port name", p.Name, validation.IsValidPortName(p.Name))
				check("container port", fmt.Sprint(p.ContainerPort), validation.IsValidPortNum(int(p.ContainerPort)))
			}
			for _, e := range c.Env {
				check("env", e.Name, validation.IsEnvVarName(e.Name))
			}
		}
	}
	for _, sec := range o.secrets {
		check("Secret name", sec.Name, validation.IsDNS1123Subdomain(sec.Name))
		for k := range sec.Data {
			check("Secret key", k, validation.IsConfigMapKey(k))
		}
	}
	for _, x := range o.pdbs {
		check("PodDisruptionBudget name", x.Name, validation.IsDNS1123Subdomain(x.Name))
	}
	for _, x := range o.policies {
		check("NetworkPolicy name", x.Name, validation.IsDNS1123Subdomain(x.Name))
	}
	return errs
}

// nodeLocalRules: the overlay reaches a host's node from its own host.
func (o *objects) nodeLocalRules() []error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf("node-local: "+format, a...)) }
	c := o.container()
	if c == nil {
		return []error{fmt.Errorf("node-local: no cachenode container")}
	}
	spec := o.sts[0].Spec.Template.Spec
	if p, ok := port(c, "http"); !spec.HostNetwork && (!ok || p.HostPort != p.ContainerPort) {
		bad("the HTTP port is not published on the host (hostPort = containerPort, or hostNetwork)")
	}
	local := 0
	for _, s := range o.services {
		if s.Spec.InternalTrafficPolicy != nil && *s.Spec.InternalTrafficPolicy == corev1.ServiceInternalTrafficPolicyLocal {
			local++
			if len(s.Spec.Ports) != 1 || s.Spec.Ports[0].Name != "http" {
				bad("Service %s: want only the HTTP port", s.Name)
			}
		}
	}
	if local != 1 {
		bad("want one Service with internalTrafficPolicy Local, found %d", local)
	}
	f := flags(c)
	sock := f["socket"]
	dir := path.Dir(sock)
	i := slices.IndexFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return path.Clean(m.MountPath) == dir })
	if sock == "" || !path.IsAbs(sock) || i < 0 {
		bad("--socket %q: not in a mounted volume", sock)
		return errs
	}
	name := c.VolumeMounts[i].Name
	j := slices.IndexFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == name && v.HostPath != nil })
	if j < 0 {
		bad("--socket %q: its directory is not a hostPath volume training pods can mount", sock)
	} else if hp := spec.Volumes[j].HostPath.Path; hp != dir {
		bad("--socket: host path %s is mounted at %s: training pods must mount it at the same path, which /v1/cluster reports", hp, dir)
	}
	uid := int64(-1)
	if sc := spec.SecurityContext; sc != nil && sc.RunAsUser != nil {
		uid = *sc.RunAsUser
	}
	if csc := c.SecurityContext; csc != nil && csc.RunAsUser != nil {
		uid = *csc.RunAsUser
	}
	if uid != 0 {
		bad("the node cannot create its socket in the root-owned host directory the kubelet creates (run as uid 0)")
	}
	if csc := c.SecurityContext; csc == nil || csc.Capabilities == nil || !slices.Contains(csc.Capabilities.Drop, "ALL") || len(csc.Capabilities.Add) > 0 {
		bad("running as uid 0, the container must drop every capability")
	}
	return errs
}
