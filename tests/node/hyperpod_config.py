"""A HyperPod resource configuration file (/opt/ml/config/resource_config.json) in the shape HyperPod writes
it on every node, with only the fields gpufleet reads. Sources for the field names:
aws-samples/awsome-distributed-training, 1.architectures/5.sagemaker-hyperpod/LifecycleScripts/base-config/
lifecycle_script.py (InstanceGroups[].Name, .Instances[].CustomerIpAddress, .InstanceName),
multi_headnode_setup/headnode_setup.sh (InstanceName "<group>-1", ClusterName),
observability/install_observability.py (ClusterConfig.ClusterArn). Python >= 3.9."""

RESOURCE_CONFIG = {
    "ClusterConfig": {
        "ClusterArn": "arn:aws:sagemaker:us-west-2:123456789012:cluster/2hd31rmi9mde",
        "ClusterName": "ml-cluster",
    },
    "InstanceGroups": [
        {
            "Name": "controller-machine",
            "InstanceType": "ml.c5.xlarge",
            "Instances": [
                {
                    "InstanceName": "controller-machine-1",
                    "CustomerIpAddress": "10.1.113.28",
                    "InstanceId": "i-09e7576cbc230c181",
                }
            ],
        },
        {
            "Name": "gpu-a",
            "InstanceType": "ml.p5.48xlarge",
            "Instances": [
                {"InstanceName": "gpu-a-1", "CustomerIpAddress": "10.1.28.64", "InstanceId": "i-0a1"},
                {"InstanceName": "gpu-a-2", "CustomerIpAddress": "10.1.28.65", "InstanceId": "i-0a2"},
                {"InstanceName": "gpu-a-3", "CustomerIpAddress": "10.1.28.66", "InstanceId": "i-0a3"},
            ],
        },
        {
            "Name": "gpu-b",
            "InstanceType": "ml.g5.12xlarge",
            "Instances": [{"InstanceName": "gpu-b-1", "CustomerIpAddress": "10.1.40.7", "InstanceId": "i-0b1"}],
        },
    ],
}
