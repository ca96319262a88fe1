// kube: the Kubernetes commands a one-node cluster needs, in one binary (as hyperkube was):
// the command is chosen by the name it is run as (a link named kubelet, kube-apiserver,
// kube-scheduler, kube-controller-manager or kubectl), or by its first argument.
// One binary shares the libraries the five would each carry, so the set packs small.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	_ "time/tzdata" // CronJob time zones (kube-apiserver, kube-controller-manager)

	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	kubectlcmd "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"

	_ "k8s.io/client-go/plugin/pkg/client/auth"
)

func main() {
	name := filepath.Base(os.Args[0])
	if name == "kube" && len(os.Args) > 1 {
		name = os.Args[1]
		os.Args = os.Args[1:]
	}
	switch name {
	case "kubelet":
		os.Exit(cli.Run(kubelet.NewKubeletCommand(context.Background())))
	case "kube-apiserver":
		os.Exit(cli.Run(apiserver.NewAPIServerCommand()))
	case "kube-scheduler":
		os.Exit(cli.Run(scheduler.NewSchedulerCommand()))
	case "kube-controller-manager":
		os.Exit(cli.Run(controllermanager.NewControllerManagerCommand()))
	case "kubectl":
		logs.GlogSetter(kubectlcmd.GetLogVerbosity(os.Args)) // nolint:errcheck
		if err := cli.RunNoErrOutput(kubectlcmd.NewDefaultKubectlCommand()); err != nil {
			kubectlutil.CheckErr(err)
		}
	default:
		fmt.Fprintf(os.Stderr, "kube: run as kubelet, kube-apiserver, kube-scheduler, kube-controller-manager or kubectl (a link of that name, or the first argument), not %q\n", name)
		os.Exit(2)
	}
}
